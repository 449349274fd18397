"""The results contract: the names and the grid that the asv suite writes and everything else reads.

The asv suite (:mod:`attnbench.asv_bench`), the regression gate (:mod:`attnbench.regress`) and the
loader (:mod:`attnbench.analysis.frame`) import these constants instead of spelling them, so a
renamed benchmark or a changed base shape cannot leave one of them reading something else.

* Benchmark names: ``TIME_BENCHMARK`` and the other fully-qualified asv names below; ``ASV_METRICS``
  maps an asv method name to the tidy frame's metric, unit factor and method label.
* The grid: ``BASE_SPEC`` (the fixed shape every asv case shares), ``ASV_LENGTHS`` /
  ``ASV_MODES`` (defaults), and the environment variables that narrow it (``ENV_*``).
* Units: ``UNITS`` per tidy metric.
* Workloads: ``WORKLOADS`` and ``SWEPT_LENGTH``, the spec field a workload's sweep varies.
"""

from __future__ import annotations

from attnbench.spec import AttnSpec

# ---- asv benchmark names (class.method, as asv stores them without the module prefix) --------
TIME_BENCHMARK = "Attention.time_attention"
PEAKMEM_BENCHMARK = "Attention.peakmem_attention"
TENSOR_BYTES_BENCHMARK = "AttentionMetrics.track_peak_tensor_bytes"
FLOPS_BENCHMARK = "AttentionMetrics.track_flops"
ERROR_RATIO_BENCHMARK = "AttentionAccuracy.track_error_ratio"
DECODE_TIME_BENCHMARK = "Decode.time_decode"
"""Decode: ``ASV_DECODE_Q_LEN`` queries over a cache of ``seq_len_k`` keys (workload "decode")."""
DECODE_GBPS_BENCHMARK = "Decode.track_decode_gbps"
GQA_TIME_BENCHMARK = "GroupedQuery.time_gqa"
"""Prefill with ``ASV_GQA_KV_HEADS`` key/value heads for ``BASE_SPEC.heads`` query heads."""
GQA_TENSOR_BYTES_BENCHMARK = "GroupedQuery.track_gqa_peak_tensor_bytes"
PEAK_BENCHMARK = "track_matmul_gflops"
"""The machine's matmul GFLOP/s (a module-level asv benchmark; matched by suffix)."""
GATED_BENCHMARKS = (TIME_BENCHMARK, TENSOR_BYTES_BENCHMARK, FLOPS_BENCHMARK, ERROR_RATIO_BENCHMARK)
"""What the regression gate runs on BASE and HEAD."""

# asv method name -> (tidy metric, factor to the metric's unit, method label; None: the runner's rule)
ASV_METRICS: dict[str, tuple[str, float, str | None]] = {
    "time_attention": ("time", 1.0, "asv"),
    "peakmem_attention": ("peak_rss", 1.0, "asv"),
    "track_peak_tensor_bytes": ("peak_tensor_bytes", 1.0, None),
    "track_gflops": ("gflops", 1.0, "asv"),
    "track_flops": ("flops", 1.0, "model"),
    "track_cuda_ms": ("cuda_time", 1e-3, "cuda_events"),
    "track_max_error": ("max_error", 1.0, "reference"),
    "track_error_ratio": ("error_ratio", 1.0, "reference"),
    "time_decode": ("time", 1.0, "asv"),
    "track_decode_gbps": ("gbps", 1.0, "asv"),
    "time_gqa": ("time", 1.0, "asv"),
    "track_gqa_peak_tensor_bytes": ("peak_tensor_bytes", 1.0, None),
}

# ---- tidy metrics and their units --------------------------------------------------------------
UNITS: dict[str, str] = {
    "time": "s", "cuda_time": "s", "compile_time": "s", "peak_tensor_bytes": "bytes", "peak_rss": "bytes",
    "gflops": "GFLOP/s", "max_error": "abs", "softmax_error": "abs", "flops": "FLOP", "error_ratio": "x tolerance",
    "bytes": "bytes", "gbps": "GB/s",
}
"""``bytes`` is :attr:`AttnSpec.bytes_moved` (method "model"); ``gbps`` is that over the measured time."""

# ---- workloads ---------------------------------------------------------------------------------
WORKLOADS: tuple[str, ...] = ("prefill", "decode")
"""``prefill``: every query of a sequence at once (Lq = Lk, compute-bound at long L); ``decode``: a few
queries (Lq = 1 per generated token, more for speculative decoding) over a long key/value cache
(memory-bound: O(Lk) work per token)."""
SWEPT_LENGTH: dict[str, str] = {"prefill": "seq_len", "decode": "seq_len_k"}
"""The tidy frame's column a workload's sweep varies (and complexity exponents are fitted against):
prefill sweeps L = Lq = Lk (``seq_len``), decode sweeps the cache length Lk (``seq_len_k``), Lq fixed."""

# ---- the grid ----------------------------------------------------------------------------------
BASE_SPEC = AttnSpec(batch=1, heads=8, head_dim=64, dtype="float32")
"""The asv suite's fixed shape (B, H, D, dtype); the grid varies variant, L, device and mode."""
ASV_LENGTHS: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
ASV_MODES: tuple[str, ...] = ("forward", "backward")
ASV_MASKS: tuple[str, ...] = ("none", "causal")
ASV_DECODE_LENGTHS: tuple[int, ...] = (4096, 16384)
"""Decode's cache lengths Lk: two points, the small asv share of the decode sweep ``attnbench run`` makes."""
ASV_DECODE_Q_LEN = 1
ASV_SMALL_VARIANTS: tuple[str, ...] = ("sdpa", "batched")
"""Variants of the decode and GQA benchmarks (fused vs materialised scores), unless ENV_VARIANTS names others."""
ASV_GQA_KV_HEADS = BASE_SPEC.heads // 4
"""Key/value heads of the GQA benchmark: 4 query heads per key/value head."""
ASV_GQA_LENGTHS: tuple[int, ...] = (1024,)
ASV_MAX_CALL_SECONDS = 1.0
"""Predicted seconds per call above which an asv case is n/a."""

# environment variables that narrow the asv grid without editing code (comma-separated lists)
ENV_VARIANTS = "ATTNBENCH_ASV_VARIANTS"
ENV_LENGTHS = "ATTNBENCH_ASV_LENGTHS"
ENV_DEVICES = "ATTNBENCH_ASV_DEVICES"
ENV_MODES = "ATTNBENCH_ASV_MODES"
ENV_MASKS = "ATTNBENCH_ASV_MASKS"
ENV_MAX_CALL_S = "ATTNBENCH_ASV_MAX_CALL_S"
ENV_BATCH = "ATTNBENCH_ASV_BATCH"
"""For tests of the gate only: results taken with it are not labelled with it."""
ENV_DECODE_LENGTHS = "ATTNBENCH_ASV_DECODE_LENGTHS"
"""Decode's cache lengths (ENV_LENGTHS narrows the prefill and GQA lengths, ENV_VARIANTS every class's variants)."""
GRID_ENV = (ENV_VARIANTS, ENV_LENGTHS, ENV_DEVICES, ENV_MODES, ENV_MASKS, ENV_MAX_CALL_S, ENV_BATCH, ENV_DECODE_LENGTHS)


def asv_case(benchmark: str, case: dict, base: AttnSpec = BASE_SPEC) -> tuple[AttnSpec, str]:
    """The case and workload one asv parameter set names: the one rule the suite and the loader share.

    Args:
        benchmark: the asv benchmark name (``Class.method``, with or without a module prefix).
        case: parameter name -> value (``variant`` is not read here).
        base: the fixed shape (the suite may change its batch for tests).

    Raises:
        ValueError, TypeError: a parameter the spec rejects (e.g. a length that is not an int >= 1).
    """
    cls = benchmark.split(".")[-2] if "." in benchmark else ""
    device = case.get("device", "cpu")
    if cls == DECODE_TIME_BENCHMARK.split(".")[0]:
        spec = base.replace(seq_len=ASV_DECODE_Q_LEN, seq_len_k=case.get("seq_len_k", 0), device=device)
        return spec, "decode"
    kv_heads = ASV_GQA_KV_HEADS if cls == GQA_TIME_BENCHMARK.split(".")[0] else None
    # older suites had no mask parameter (unmasked) and, before that, no mode (forward)
    spec = base.replace(seq_len=case.get("seq_len", 0), device=device, mode=case.get("mode", "forward"),
                        mask=case.get("mask", "none"), kv_heads=kv_heads)
    return spec, "prefill"

# ---- the teaching progression (the report's headline figure) -------------------------------------
PROGRESSION: tuple[str, ...] = ("loop", "vectorized", "batched", "torch_mha", "sdpa")
"""From the Python loop to fused SDPA, the order in which the lecture notes build attention up."""
