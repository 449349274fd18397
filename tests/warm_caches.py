"""Fill the on-disk caches the test workers share, once per test run, before they need them.

``pytest -n 4`` starts four workers at once, and on a fresh machine each that reaches a compiled variant pays
Inductor's one-time cost itself (its CPU instruction-set checks and first C++ builds: 114 s of a cold first call of
``compiled_batched`` at L=256 against 6.5 s warm; a new shape after any warm compile costs a third of a cold start),
and each that first draws a figure builds matplotlib's font list. ``tests/conftest.py`` starts this module once, in
the process that hands out the tests, while the workers begin with the minutes-long modules; the modules that
compile wait for it (:data:`COMPILES`), so that they start from a warm cache instead of four workers filling it at once.

It fills the caches the workers would read (``TORCHINDUCTOR_CACHE_DIR``, else Inductor's default, and ``MPLCONFIGDIR``,
else matplotlib's): it proves nothing itself and changes no result, only who pays the first compile.

Run it alone as ``python -m tests.warm_caches``.
"""

from __future__ import annotations

import time

__all__ = ["COMPILES", "SHAPE", "warm"]

COMPILES = ("test_variants.py", "test_flops.py", "test_compiled_warmup.py", "test_gpu_features.py")
"""The test modules that compile on a CPU-only machine (``grep -ln 'compiled_\\|flex\\|all_variants' tests/``): their
first test waits until this module is done."""
SHAPE = dict(batch=1, heads=2, seq_len=32, head_dim=16)
"""A tiny shape: what is paid once per machine does not depend on it, and no test compiles exactly it."""


def warm(say=print) -> None:
    """Build matplotlib's font list, then compile each compiled variant once, forward and backward (flex: causal)."""
    start = time.perf_counter()
    import matplotlib.font_manager  # noqa: F401 - builds and saves the font list where none is saved

    say(f"matplotlib's font list: {time.perf_counter() - start:.1f} s")
    import attnbench
    from attnbench.measure.runner import make_call
    from attnbench.variants.compiled import _compiler_reasons

    if _compiler_reasons("cpu"):
        say("no C compiler: nothing to compile")
        return
    for name, mask, modes in (
        ("compiled_batched", "none", ("forward", "backward")),
        ("compiled_chunked", "none", ("forward", "backward")),
        ("flex", "causal", ("forward",)),
    ):
        for mode in modes:
            t = time.perf_counter()
            variant = attnbench.get_variant(name)
            spec = attnbench.AttnSpec(**SHAPE, mask=mask, mode=mode)
            call, _, _ = make_call(variant, spec, seed=0)
            variant.warm_up(call)
            say(f"{name} {mode}: {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    warm()
