"""asv benchmarks: attention time and memory vs sequence length and mask (thin; logic in attnbench.asv_bench).

Parameters come from ``attnbench.asv_bench.PARAMS``; impossible cases raise NotImplementedError in
``setup`` and show as n/a.
"""

from attnbench import asv_bench as ab


class Attention:
    """Wall time (asv's timer) and process peak RSS per variant x length x device x pass x mask."""

    params, param_names = ab.params()
    repeat = (3, 10, 4.0)
    timeout = 180

    def setup(self, *p):
        self.call, _ = ab.case(*p)

    def time_attention(self, *p):
        self.call()

    def peakmem_attention(self, *p):
        self.call()


class AttentionMetrics:
    """Peak tensor bytes (profiler / CUDA allocator) and achieved GFLOP/s."""

    params, param_names = ab.params()
    timeout = 180

    def setup(self, *p):
        ab.case(*p)

    def track_peak_tensor_bytes(self, *p):
        return ab.peak_tensor_bytes(*p)

    track_peak_tensor_bytes.unit = "bytes"

    def track_gflops(self, *p):
        return ab.gflops(*p)

    track_gflops.unit = "GFLOP/s"

    def track_flops(self, *p):
        return ab.flops(*p)

    track_flops.unit = "FLOP"


class AttentionAccuracy:
    """The correctness gate on the timed closure's result: max error and error / tolerance (> 1: wrong)."""

    params, param_names = ab.params()
    timeout = 180

    def setup(self, *p):
        ab.setup_accuracy(*p)

    def track_max_error(self, *p):
        return ab.error(*p)

    track_max_error.unit = "abs error"

    def track_error_ratio(self, *p):
        return ab.error_ratio(*p)

    track_error_ratio.unit = "x tolerance"


if ab.CUDA:

    class AttentionCuda:
        """CUDA-event time per call: kernel time without host-side timer noise."""

        params, param_names = ab.params()
        timeout = 180

        def setup(self, variant, seq_len, device, mode, mask):
            if device != "cuda":
                raise NotImplementedError("CUDA-event time is measured on cuda only")
            ab.case(variant, seq_len, device, mode, mask)

        def track_cuda_ms(self, *p):
            return ab.cuda_event_ms(*p)

        track_cuda_ms.unit = "ms"


class Decode:
    """Decode: one query over a cache of Lk keys (memory-bound): time and achieved GB/s per variant x Lk."""

    params, param_names = ab.params(table=ab.DECODE_PARAMS)
    repeat = (3, 10, 4.0)
    timeout = 180

    def setup(self, *p):
        self.call, _ = ab.decode_case(*p)

    def time_decode(self, *p):
        self.call()

    def track_decode_gbps(self, *p):
        return ab.decode_gbps(*p)

    track_decode_gbps.unit = "GB/s"


class GroupedQuery:
    """Grouped-query attention (H/4 key/value heads): time and peak tensor bytes per variant x L."""

    params, param_names = ab.params(table=ab.GQA_PARAMS)
    repeat = (3, 10, 4.0)
    timeout = 180

    def setup(self, *p):
        self.call, _ = ab.gqa_case(*p)

    def time_gqa(self, *p):
        self.call()

    def track_gqa_peak_tensor_bytes(self, *p):
        return ab.gqa_peak_tensor_bytes(*p)

    track_gqa_peak_tensor_bytes.unit = "bytes"


def track_matmul_gflops():
    """Matmul roof of the machine, so reports can show attention GFLOP/s as % of peak."""
    return ab.matmul_gflops()


track_matmul_gflops.unit = "GFLOP/s"
