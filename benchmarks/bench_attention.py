"""asv benchmarks: attention time and memory vs sequence length (thin; logic in attnbench.asv_bench)."""

from attnbench import asv_bench as ab


class Attention:
    """Wall time (asv's timer) and process peak RSS per variant x length x device x pass."""

    params, param_names = ab.params()
    timeout = 180

    def setup(self, *p):
        self.call, _ = ab.case(*p)

    def time_attention(self, *p):
        self.call()

    def peakmem_attention(self, *p):
        self.call()


class AttentionMetrics:
    """Engine metrics asv cannot take itself: peak tensor bytes, GFLOP/s, CUDA-event time, max error."""

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

    def track_cuda_ms(self, *p):
        return ab.cuda_event_ms(*p)

    track_cuda_ms.unit = "ms"

    def track_max_error(self, *p):
        return ab.error(*p)

    track_max_error.unit = "abs error"
