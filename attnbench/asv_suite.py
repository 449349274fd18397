"""The asv suite's attention classes, in the package so that any repository can run them.

``benchmarks/bench_attention.py`` (attnbench's own suite) and the one ``attnbench init`` writes into
a repository of your own (:mod:`attnbench.gate.init`) both re-export these classes: asv discovers
them in that module and names them ``bench_attention.<class>.<method>``, the names the gate and the
loaders read (:data:`attnbench.contract.GATED_BENCHMARKS`). In the package, a ``pip install
attnbench`` brings them; a copy in each repository would go stale.

Parameters come from ``attnbench.asv_bench.PARAMS`` (the tier ``ATTNBENCH_ASV_GRID`` selects);
impossible cases raise NotImplementedError in ``setup`` and show as n/a. Each ``@ab.tracked`` class
receives the ``track_`` methods the metric table (``attnbench.contract.METRICS``) assigns to it,
with their units.

The main grid's classes inherit one ``setup_cache`` (asv keys it by its function: it runs once for
all of them): every case through the correctness gate once, its verdicts handed to every benchmark
process as the first argument.
"""

from attnbench import asv_bench as ab

__all__ = [
    "Attention",
    "AttentionMetrics",
    "AttentionAccuracy",
    "Instructions",
    "Decode",
    "GroupedQuery",
    "track_matmul_gflops",
]


class _MainGrid:
    """The main grid's parameters and its shared ``setup_cache``.

    Not a benchmark: it has no benchmark methods."""

    params, param_names = ab.params()
    timeout = 180

    def setup_cache(self):
        return ab.grid_verdicts()

    setup_cache.timeout = ab.GRID_SETUP_TIMEOUT


class Attention(_MainGrid):
    """Wall time (asv's timer) and process peak RSS per variant x length x device x pass x mask."""

    repeat = (3, 10, 4.0)
    timer = (
        ab.TIMER
    )  # the wall clock, with the run-queue wait beside it (the gate's sign of a neighbour)

    def setup(self, verdicts, *p):
        ab.use(verdicts)
        self.call, _ = ab.timed_case(*p)

    def teardown(self, verdicts, *p):
        ab.timed_teardown()

    def time_attention(self, verdicts, *p):
        self.call()

    def peakmem_attention(self, verdicts, *p):
        self.call()


@ab.tracked
class AttentionMetrics(_MainGrid):
    """Peak tensor bytes (profiler / CUDA allocator), GFLOP/s, FLOPs and page faults per call."""

    def setup(self, verdicts, *p):
        ab.use(verdicts)
        ab.check(*p)


@ab.tracked
class AttentionAccuracy(_MainGrid):
    """The correctness gate on the timed call's result: max error, error / tolerance (>1: wrong)."""

    def setup(self, verdicts, *p):
        ab.use(verdicts)
        ab.setup_accuracy(*p)


@ab.tracked
class Instructions:
    """Instructions per call under valgrind: the main grid's CPU cases within its counting budget.

    Counted in one valgrind process."""

    params, param_names = ab.params(table=ab.INSTRUCTION_PARAMS)
    rounds = 1  # counts are deterministic: one round
    timeout = 180

    def setup_cache(self):
        return ab.instruction_counts()

    setup_cache.timeout = ab.INSTRUCTION_SETUP_TIMEOUT

    def setup(self, counts, *p):
        ab.instruction_case(counts, *p)


if ab.CUDA:
    __all__ += ["AttentionCuda"]

    @ab.tracked
    class AttentionCuda(_MainGrid):
        """CUDA-event time per call: kernel time without host-side timer noise."""

        def setup(self, verdicts, variant, seq_len, device, mode, mask):
            if device != "cuda":
                raise NotImplementedError("CUDA-event time is measured on cuda only")
            ab.use(verdicts)
            ab.check(variant, seq_len, device, mode, mask)


@ab.tracked
class Decode:
    """Decode: one query over a cache of Lk keys (memory-bound): time and GB/s per variant x Lk."""

    params, param_names = ab.params(table=ab.DECODE_PARAMS)
    repeat = (3, 10, 4.0)
    timeout = 180

    def setup_cache(self):
        return ab.decode_verdicts()

    setup_cache.timeout = ab.GRID_SETUP_TIMEOUT

    def setup(self, verdicts, *p):
        ab.use(verdicts)
        self.call, _ = ab.decode_case(*p)

    def time_decode(self, verdicts, *p):
        self.call()


@ab.tracked
class GroupedQuery:
    """Grouped-query attention (H/4 key/value heads): time and peak tensor bytes per variant x L."""

    params, param_names = ab.params(table=ab.GQA_PARAMS)
    repeat = (3, 10, 4.0)
    timeout = 180

    def setup_cache(self):
        return ab.gqa_verdicts()

    setup_cache.timeout = ab.GRID_SETUP_TIMEOUT

    def setup(self, verdicts, *p):
        ab.use(verdicts)
        self.call, _ = ab.gqa_case(*p)

    def time_gqa(self, verdicts, *p):
        self.call()


def track_matmul_gflops():
    """Matmul roof of the machine, so reports can show attention GFLOP/s as % of peak."""
    return ab.matmul_gflops()


track_matmul_gflops.unit = "GFLOP/s"
