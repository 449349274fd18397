"""asv benchmarks: attention time and memory vs sequence length and mask (thin; logic in attnbench.asv_bench).

The classes live in :mod:`attnbench.asv_suite`, so that a repository of your own measures its variants with the same
suite (``attnbench init`` writes a module like this one there). asv discovers them here and names them
``bench_attention.<class>.<method>``: their code, and so asv's benchmark versions, are the same wherever they live.
"""

from attnbench.asv_suite import *  # noqa: F403
