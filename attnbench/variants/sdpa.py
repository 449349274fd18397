"""``F.scaled_dot_product_attention`` with a selectable backend.

Backends (``torch.nn.attention.SDPBackend``): ``math`` (the reference C++ composite, O(L^2)
memory), ``flash`` (FlashAttention-2 on CUDA, a tiled kernel on CPU), ``efficient``
(memory-efficient attention, CUDA only) and ``cudnn`` (CUDA only); ``auto`` lets PyTorch choose.
Forcing one backend makes a case that backend cannot run fail loudly instead of silently falling
back to math.

Masks, the production way: an exactly causal mask is passed as ``is_causal=True`` (top-left
aligned, the same as :func:`attnbench.mask_mods.causal`), never as a dense tensor; every other mask
is a dense boolean ``attn_mask``. The separately registered ``sdpa_dense_mask`` always takes the
dense boolean tensor, so the price of a materialised mask is visible beside ``sdpa``. Which backend
takes which masks and grouped heads: :meth:`SDPA.extra_reasons` and :meth:`SDPA.gqa_mode`.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench import mask_mods
from attnbench._checks import cuda_present
from attnbench.capability import CallInfo
from attnbench.mask_mods import MaskMod
from attnbench.spec import MaskForm
from attnbench.variants.base import GqaMode, Variant

__all__ = [
    "CPU_FLASH_OPS",
    "SDPA",
    "cpu_flash_tiles",
    "hand_table_only",
    "kernel_tiles",
]

_BACKENDS: dict[str, SDPBackend | None] = {
    "auto": None,
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
_CUDA_ONLY = frozenset({"efficient", "cudnn"})
_HALF = frozenset({"float16", "bfloat16"})


_CAN_USE: dict[str, str] = {
    "flash": "can_use_flash_attention",
    "efficient": "can_use_efficient_attention",
    "cudnn": "can_use_cudnn_attention",
}
"""Backend -> the ``torch.backends.cuda`` function that says whether it can run a call (and, with
``debug=True``, warns why not): the very checks SDPA's dispatcher runs before "No available
kernel"."""
_ASK_TORCH = [True]


@contextlib.contextmanager
def hand_table_only() -> Iterator[None]:
    """Answer CUDA capability questions from the hand table alone while inside.

    Asking torch builds CUDA tensors, which initialises CUDA: a process that must never do that
    (asv's forkserver, which forks every benchmark process) asks inside this context.
    """
    before = _ASK_TORCH[0]
    _ASK_TORCH[0] = False
    try:
        yield
    finally:
        _ASK_TORCH[0] = before


def _torch_reasons(backend: str, call: CallInfo, is_causal: bool, masked: bool) -> list[str] | None:
    """Why torch says ``backend`` cannot run ``call`` ([] when it can); None where it cannot say.

    Torch can say on CUDA, where ``torch.backends.cuda.can_use_*_attention`` exists for the
    backend, outside :func:`hand_table_only`. The reason is torch's own warning text
    (``debug=True``), so a skipped row says what this torch release refuses, not what an older
    one did.

    Args:
        backend: ``"flash"``, ``"efficient"`` or ``"cudnn"``.
        call: the call, as :class:`~attnbench.capability.CallInfo` describes it.
        is_causal: passed as ``is_causal=True`` (no mask tensor).
        masked: a dense mask is passed (converted to the query's dtype, as SDPA does).
    """
    name = _CAN_USE.get(backend)
    if (
        name is None
        or call.device != "cuda"
        or not _ASK_TORCH[0]
        or getattr(torch.backends.cuda, name, None) is None
        or not cuda_present()
    ):
        return None
    return _asked(backend, call, is_causal, masked)


@functools.lru_cache(maxsize=256)
def _asked(backend: str, call: CallInfo, is_causal: bool, masked: bool) -> list[str] | None:
    """torch's answer for one call, asked once per process (it allocates the call's inputs)."""
    can_use = getattr(torch.backends.cuda, _CAN_USE[backend])
    try:
        params = _sdpa_params(call, is_causal, masked)
    except (RuntimeError, TypeError):  # out of memory, or a constructor this code does not know
        return None
    with warnings.catch_warnings(record=True) as caught, sdpa_kernel(_BACKENDS[backend]):
        warnings.simplefilter("always")
        runs = bool(can_use(params, debug=True))
    if runs:
        return []
    said = "; ".join(dict.fromkeys(str(w.message).strip() for w in caught)) or "no reason given"
    return [f"SDPA backend {backend}: torch {torch.__version__} cannot run this call: {said}"]


def _sdpa_params(call: CallInfo, is_causal: bool, masked: bool, device: str = "cuda") -> object:
    """``torch.backends.cuda.SDPAParams`` for ``call``: empty CUDA tensors of its shapes and dtype.

    SDPA converts a boolean mask to an additive one of the query's dtype before its dispatcher
    checks the backends, so the mask here is that. The constructor took six arguments before
    ``enable_gqa`` joined it (torch 2.5); both forms are tried.
    """
    kw = {"dtype": getattr(torch, call.dtype), "device": device}
    grad = call.backward
    q = torch.empty(call.batch, call.heads, call.lq, call.d, **kw, requires_grad=grad)
    k = torch.empty(call.batch, call.hkv, call.lk, call.d, **kw, requires_grad=grad)
    v = torch.empty(call.batch, call.hkv, call.lk, call.dv, **kw, requires_grad=grad)
    mask = torch.zeros(1, 1, call.lq, call.lk, **kw) if masked else None
    params = torch.backends.cuda.SDPAParams
    try:
        return params(q, k, v, mask, 0.0, is_causal, call.hkv != call.heads)
    except TypeError:
        return params(q, k, v, mask, 0.0, is_causal)


_CUDA_TILES: dict[tuple[str, str], tuple[tuple[int, tuple[int, int]], ...]] = {
    # FlashAttention-2 as vendored in PyTorch (aten/.../transformers/cuda/flash_attn/
    # flash_fwd_launch_template.h, flash_bwd_launch_template.h), without dropout, on sm80/sm90:
    # forward 128 x 128 for D <= 64, 128 x 64 for D <= 128
    ("flash", "forward"): ((64, (128, 128)), (128, (128, 64))),
    # backward (>= 144 KiB shared memory per block: A100, H100) 128 x 128 for D <= 64, 64 x 128
    # for D <= 128
    ("flash", "backward"): ((64, (128, 128)), (128, (64, 128))),
    # memory-efficient attention (the CUTLASS kernels of xFormers in PyTorch, cutlassF sm80):
    # 64 x 64 for D <= 64, 64 x 128 for D <= 128, 32 x 128 beyond; its causal forward stops at
    # the block's last allowed key (``num_keys = min(query_start + kQueriesPerBlock, num_keys)``)
    ("efficient", "forward"): ((64, (64, 64)), (128, (64, 128)), (65536, (32, 128))),
}
"""``(backend, pass) -> ((largest head dim, (query rows, key columns)), ...)``: the tiles of the
CUDA kernels that skip masked tiles under ``is_causal``, from their sources. Absent: not known here
(cuDNN is closed source; the memory-efficient backward picks among several kernels at run time;
``auto`` picks a backend at run time), and its executed FLOPs are declared unknown. sm86/sm89
differ for D = 96-128 (64 x 64 causal forward); the tiles listed are the data-centre parts' (A100,
H100)."""


def kernel_tiles(backend: str, pass_: str, head_dim: int) -> tuple[int, int] | None:
    """The ``(query, key)`` tile of ``backend``'s CUDA kernel for one pass; None when unknown.

    Example:
        >>> kernel_tiles("flash", "forward", 64), kernel_tiles("cudnn", "forward", 64)
        ((128, 128), None)
    """
    for largest, tiles in _CUDA_TILES.get((backend, pass_), ()):
        if head_dim <= largest:
            return tiles
    return None


_CPU_FLASH_Q_BLOCKS = ((768, 256), (192, 64), (1, 32))
"""``(smallest Lq, query rows)``: the query block of PyTorch's CPU flash-attention kernel
(``flash_attention_kernel_impl`` and its backward in PyTorch's
aten/src/ATen/native/cpu/FlashAttentionKernel.cpp;
the pinned torch's causal calls take 0.63 of the unmasked time at L=2048, as this rule computes
0.625 of the pairs): 256 rows from Lq = 768, 64 from 192, else 32."""
_CPU_FLASH_KEY_BLOCK = 512
"""Key columns of the CPU kernel's blocks. Under ``is_causal`` a query block starting at row ``m``
computes the key blocks that start before ``min(m + rows, Lk)`` (``num_keys``), each whole
(``kvBlockSize = min(kvSplitSize, kvSize - n)``), and masks the pairs past the diagonal only after
computing them: exactly the non-empty tiles of this size. Both passes follow the rule."""


def cpu_flash_tiles(lq: int, lk: int) -> tuple[int, int]:
    """The ``(query, key)`` block of PyTorch's CPU flash-attention kernel for these lengths.

    Example:
        >>> cpu_flash_tiles(2048, 2048), cpu_flash_tiles(256, 256), cpu_flash_tiles(100, 300)
        ((256, 512), (64, 256), (32, 300))
    """
    rows = next(rows for smallest, rows in _CPU_FLASH_Q_BLOCKS if lq >= smallest)
    return min(rows, lq), min(_CPU_FLASH_KEY_BLOCK, lk)


CPU_FLASH_OPS = frozenset(
    {
        "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    }
)


class _AsMath:
    """A view of an SDPA variant as the eager math composite (for the cost model only)."""

    RECOMPUTES_SCORES = False

    def __init__(self, sdpa: SDPA) -> None:
        self._sdpa = sdpa

    def __getattr__(self, name):
        return getattr(self._sdpa, name)


class SDPA(Variant):
    """PyTorch's fused attention; the production baseline every other variant is compared with.

    FLOPs: the fused kernels recompute the scores in the backward pass (backward factor 2.5,
    FlopCounterMode's own SDPA formula). On CPU both ``auto`` and ``flash`` run
    ``_scaled_dot_product_flash_attention_for_cpu``, for which FlopCounterMode has no formula:
    those contractions are declared invisible and checked against the counter's formula instead.
    """

    source = "torch.nn.functional.scaled_dot_product_attention; Dao et al. 2022 (FlashAttention)"
    PROVENANCE = True

    def __init__(
        self, backend: str = "auto", dense_mask: bool = False, scale: float | None = None
    ) -> None:
        super().__init__(scale)
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {tuple(_BACKENDS)}, got {backend!r}")
        if not isinstance(dense_mask, bool):
            raise TypeError(f"dense_mask must be a bool, got {type(dense_mask).__name__}")
        self.backend = backend
        self.dense_mask = dense_mask  # always pass the dense boolean mask (never is_causal)
        fused = backend in ("flash", "efficient", "cudnn")
        self.memory_exponent = 1.0 if fused or backend == "auto" else 2.0
        self.SCORE_BUFFERS = 0.0 if fused or backend == "auto" else 2.0
        self.RECOMPUTES_SCORES = backend != "math"
        self.OPAQUE_KERNELS = frozenset() if backend == "math" else CPU_FLASH_OPS
        if backend in _CUDA_ONLY:
            self.SUPPORTED_DEVICES = frozenset({"cuda"})

    def takes_mask_mod(self, mod):
        """Only an exactly causal predicate (as ``is_causal=True``), unless ``dense_mask``."""
        return not self.dense_mask and mod is not None and mod.is_causal

    def _runs_math(self, spec) -> bool:
        """On CPU, ``auto`` falls back to math when Dv != D (the CPU flash kernel needs Dv == D)."""
        return self.backend == "math" or (
            self.backend == "auto" and spec.device_type == "cpu" and spec.dv != spec.head_dim
        )

    def scores_visible(self, spec):
        return self._runs_math(spec) or spec.device_type != "cpu"

    def contractions(self, spec):
        if self.RECOMPUTES_SCORES and self._runs_math(spec):
            return Variant.contractions(_AsMath(self), spec)
        return super().contractions(spec)

    def _skips_tiles(self, spec) -> bool:
        """Whether a fused kernel gets ``is_causal`` here and skips the tiles past the diagonal.

        On CUDA every backend but math; on CPU the flash kernel (``auto`` and ``flash`` where they
        do not run the math composite).
        """
        fused = self.backend != "math" and not self._runs_math(spec)
        return fused and self.mask_form(spec) == MaskForm.MOD

    def _tiles(self, spec, pass_: str) -> tuple[int, int] | None:
        """The kernel's ``(query, key)`` tile for ``pass_``; None where it is not known."""
        if spec.device_type == "cpu":
            return cpu_flash_tiles(spec.lq, spec.lk)
        return kernel_tiles(self.backend, pass_, max(spec.head_dim, spec.dv))

    def _tile_pairs(self, spec, pass_: str) -> int:
        """Pairs in the non-empty tiles of ``pass_``'s kernel (every pair when it skips none).

        Counted by :func:`~attnbench.mask_mods.nonempty_tile_pairs`, the count ``chunked`` uses.
        Where the tiles are unknown, every pair (an upper bound; the rate is then not reported:
        :meth:`executed_flops_unknown`).
        """
        tiles = self._tiles(spec, pass_)
        if not self._skips_tiles(spec) or tiles is None:
            return spec.lq * spec.lk
        return mask_mods.nonempty_tile_pairs(
            spec.mask_mod(device="cpu"), spec.batch, spec.heads, spec.lq, spec.lk, *tiles
        )

    def executed_pairs(self, spec):
        """Pairs in the kernel's computed tiles: under ``is_causal``, the non-empty tiles at the
        kernel's tile size (CUDA: :data:`_CUDA_TILES`; CPU: :func:`cpu_flash_tiles`); else every
        pair.

        The forward kernel's count serves the backward too: where their tiles differ
        (FlashAttention at D=128: 128 x 64 forward, 64 x 128 backward) a square causal mask gives
        both the same count (checked by the tests); the CPU kernel's backward uses its forward's
        blocks.
        """
        return self._tile_pairs(spec, "forward")

    def executed_flops_unknown(self, spec) -> str:
        """Why this case's executed FLOPs are unknown ("" when they are counted).

        A CUDA kernel given ``is_causal`` skips the tiles above the diagonal; without its tile
        sizes (:data:`_CUDA_TILES`) the FLOPs it executes, and so its rate, are not known.
        """
        if not self._skips_tiles(spec) or spec.device_type == "cpu":
            return ""
        d = max(spec.head_dim, spec.dv)
        passes = ("forward", "backward") if spec.mode == "backward" else ("forward",)
        missing = [p for p in passes if kernel_tiles(self.backend, p, d) is None]
        if not missing:
            return ""
        why = {
            "auto": "PyTorch picks the backend at run time",
            "cudnn": "cuDNN's tile sizes are not published",
        }.get(self.backend, f"its {' and '.join(missing)} tile sizes at D={d} are not modelled")
        return (
            f"executed FLOPs unknown: SDPA {self.backend} on CUDA skips masked tiles under "
            f"is_causal and {why}"
        )

    def gqa_mode(self, call):
        """How ``enable_gqa=True`` runs here: "native", "repeat", or "" (not supported).

        On CPU the flash kernel reads the shared heads in place, while the math composite repeats k
        and v to H heads first (measured: its peak grows by those copies), so ``auto`` and ``flash``
        are "native" and ``math`` (or ``auto`` falling back to math when Dv != D) "repeat". On CUDA,
        FlashAttention-2 takes grouped heads and ``auto`` may fall back to the math composite; the
        efficient and cuDNN kernels are declared unsupported (""): their acceptance of grouped heads
        has changed between PyTorch releases and is not verified here.
        """
        if self.backend in ("efficient", "cudnn"):
            return ""
        if self.backend == "math" or (
            self.backend == "auto" and (call.device == "cuda" or call.dv != call.d)
        ):
            # the math composite (or a possible fallback to it) repeats k and v
            return GqaMode.REPEAT
        return GqaMode.NATIVE

    def extra_reasons(self, call):
        """The backend's own limits: torch's answer on CUDA where it gives one, else the table.

        On CUDA, ``flash``, ``efficient`` and ``cudnn`` ask torch (:func:`_torch_reasons`): each
        release moves their limits. Where torch cannot say (CPU, an older torch, no CUDA here) the
        hand table (:meth:`table_reasons`) answers.
        """
        causal = call.mask_kinds == {"causal"} and not self.dense_mask
        asked = None
        if self.backend in _CAN_USE:
            asked = _torch_reasons(
                self.backend,
                call,
                is_causal=causal,
                masked=bool(call.mask_kinds - {"none"}) and not causal,
            )
        reasons = self.table_reasons(call) if asked is None else list(asked)
        if self.backend in _CAN_USE and not call.last_dim_contiguous:
            reasons.append(
                f"SDPA backend {self.backend} needs q, k, v with stride 1 along the head dim"
            )
        return reasons

    def table_reasons(self, call: CallInfo) -> list[str]:
        """The hand-declared limits (PyTorch's ``sdp_utils`` rules as of torch 2.4): the fallback.

        FlashAttention and cuDNN take no ``attn_mask`` but do take ``is_causal``; FlashAttention-2
        refuses ``is_causal`` when ``Lq != Lk`` (its causal mask is bottom-right aligned, so PyTorch
        rejects non-square causal there); the memory-efficient kernel takes both.
        """
        reasons = []
        if call.device == "cuda" and self.backend in ("flash", "cudnn"):
            if call.dtype not in _HALF:
                reasons.append(
                    f"SDPA backend {self.backend} on CUDA needs float16/bfloat16, got {call.dtype}"
                )
            if not call.mask_kinds <= {"none", "causal"} or (
                self.dense_mask and call.mask_kinds != {"none"}
            ):
                reasons.append(
                    f"SDPA backend {self.backend} on CUDA takes no explicit boolean mask "
                    "(causal only, as is_causal)"
                )
            elif "causal" in call.mask_kinds and self.backend == "flash" and call.lq != call.lk:
                reasons.append(
                    f"SDPA flash on CUDA refuses is_causal with Lq={call.lq} != Lk={call.lk} "
                    "(FlashAttention-2 aligns causal bottom-right)"
                )
        if self.backend == "flash" and call.dv != call.d:
            reasons.append(f"SDPA flash needs Dv == D (D={call.d}, Dv={call.dv})")
        return reasons

    def forward(self, q, k, v, mask):
        backend = _BACKENDS[self.backend]
        ctx = contextlib.nullcontext() if backend is None else sdpa_kernel(backend)
        # grouped-query attention: query head h reads key/value head h // G
        gqa = k.shape[1] != q.shape[1]
        with ctx:
            if isinstance(mask, MaskMod):  # exactly causal (takes_mask_mod): the production call
                return F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=self.scale, enable_gqa=gqa
                )
            # SDPA already returns zeros for rows with no allowed key (checked by the tests).
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=gqa
            )
