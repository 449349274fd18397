"""Compiled variants: ``torch.compile`` of an eager variant, and FlexAttention.

Compilation happens in the first call of the timed closure itself (:meth:`warm_up`: same grad mode,
same inputs as the timed calls, so nothing recompiles in the timed path), whose duration the runner
records as ``compile_seconds``; it is never inside a timed region. Each new shape recompiles
(``dynamic=False``), which costs seconds on a CPU, so these variants are not in the default sweep:
ask for them by name.
"""

from __future__ import annotations

import functools
import shutil
import time

import torch

from attnbench import mask_mods, masks
from attnbench._checks import check_bool
from attnbench.variants.base import GqaMode, Variant, declared_attributes

__all__ = ["CompiledVariant", "flex_cpu_kernel_fault", "FlexAttention"]

_HALF_AND_FLOAT = frozenset({"float32", "bfloat16", "float16"})


_RECOMPILE_LIMIT = 64

_BASE_OPTIONS: dict[str, dict[str, object]] = {"chunked": {"q_chunk": 128}}
"""Constructor options of a base variant when compiled. ``chunked``: 128-row tiles as wide as its
byte cap allows (4096 float32 keys). Inductor computes every score tile of a query block before
that block's softmax (eager's 256 x 2048 tiles: two 16 MiB buffers live per block at L=4096, H=8),
and one full-width tile lets it fuse the row maximum, exp2 and sum row by row in cache; 128 x 4096
timed 5-10% faster than 512 x 512 or 256 x 1024 (2026-11-22,
``python -m studies.chunked_speed``)."""


def _configure_dynamo() -> None:
    """A sweep compiles one graph per shape: allow that many, and never fall back silently.

    Dynamo's default stops recompiling after 8 shapes per function and runs it *eagerly* from then
    on, which would quietly turn a "compiled" measurement into an eager one. Here the limit is
    raised and hitting it is an error, which the runner records as an ``error`` row.
    """
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, _RECOMPILE_LIMIT)
    dynamo_config.fail_on_recompile_limit_hit = True


def _first_call(call):
    """``(call(), seconds)`` for the first call, synchronised on CUDA (that call compiles)."""
    start = time.perf_counter()
    result = call()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


_FLEX_CUDA_MIN_DIM = 16
"""Smallest D and Dv inductor's FlexAttention template lowers on CUDA (``tl.dot`` needs 16)."""


def _compiler_reasons(device: str) -> list[str]:
    if device == "cpu" and not (shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")):
        return ["torch.compile on CPU needs a C/C++ compiler (gcc), none found"]
    return []


class CompiledVariant(Variant):
    """``torch.compile(base.forward)``; declares exactly what its base declares.

    Every declared class attribute of :class:`Variant` (see :func:`declared_attributes`) is read
    from the base, so a declaration added later cannot be forgotten here. Building one compiles
    nothing and leaves torch's global Dynamo settings alone: those are set on the first real call
    (:meth:`warm_up` or :meth:`validate`), so listing variants has no side effects.
    """

    VARIANT_OPTIONS = {"base": _BASE_OPTIONS}

    def __init__(
        self, base: Variant, mode: str | None = None, dynamic: bool | None = False
    ) -> None:
        """Wrap ``base`` in ``torch.compile(mode=mode, dynamic=dynamic)`` (compiles nothing yet).

        Raises:
            ValueError: for an unknown ``mode`` (the modes torch.compile knows); an unknown base
                name is refused by the registry, which builds it.
            TypeError: for a ``base`` that is not a Variant, a ``mode`` that is not a str or None,
                or a ``dynamic`` that is not a bool or None.
        """
        super().__init__(None)
        if not isinstance(base, Variant):
            raise TypeError(
                f"base must be a Variant (or, through get_variant, a registered name), got {base!r}"
            )
        if mode is not None:
            if not isinstance(mode, str):
                raise TypeError(f"mode must be a str or None, got {type(mode).__name__} {mode!r}")
            from torch._inductor import list_mode_options

            if mode not in list_mode_options():
                raise ValueError(
                    f"mode must be None or one of {sorted(list_mode_options())}, got {mode!r}"
                )
        if dynamic is not None:
            check_bool("dynamic", dynamic)
        self.base = base
        for attr in declared_attributes():
            setattr(self, attr, getattr(self.base, attr))
        self.IN_DEFAULT_SWEEP = False  # compiling costs seconds per shape
        self.source = f"torch.compile of {base.name} ({base.source})"
        self.scale = self.base.scale
        self._mode, self._dynamic = mode, dynamic
        # torch.compile's wrapper, made on the first call: making it imports Dynamo and Inductor
        # (seconds), which every process that merely lists the variants would otherwise pay
        self._compiled = None

    # Everything the cost model and the capability rules say comes from the base.
    def _same_qk_dim(self) -> bool:
        return self.base._same_qk_dim()

    def extra_reasons(self, call):
        return self.base.extra_reasons(call) + _compiler_reasons(call.device)

    def check_values(self, q, k, v):
        self.base.check_values(q, k, v)

    def reference(self, q, k, v, mask=None, dtype=torch.float64):
        return self.base.reference(q, k, v, mask, dtype)

    def reference_is_blockwise(self):
        return self.base.reference_is_blockwise()

    def contractions(self, spec):
        return self.base.contractions(spec)

    def executed_pairs(self, spec):
        return self.base.executed_pairs(spec)

    def useful_pairs(self, spec):
        return self.base.useful_pairs(spec)

    def scores_visible(self, spec):
        return self.base.scores_visible(spec)

    def scratch_elements(self, spec):
        return self.base.scratch_elements(spec)

    def parameter_bytes(self, spec):
        return self.base.parameter_bytes(spec)

    def takes_mask_mod(self, mod):
        return self.base.takes_mask_mod(mod)

    def gqa_mode(self, call):
        return self.base.gqa_mode(call)

    def validate(self, q, k, v, mask=None):
        mask4 = super().validate(q, k, v, mask)
        _configure_dynamo()
        return mask4

    def warm_up(self, call):
        """The first call of the timed closure compiles; its time is the compile time.

        Same grad mode and inputs as the timed calls, so nothing recompiles in the timed path.
        """
        _configure_dynamo()
        return _first_call(call)

    def forward(self, q, k, v, mask):
        if self._compiled is None:
            self._compiled = torch.compile(
                self.base.forward, mode=self._mode, dynamic=self._dynamic
            )
        return self._compiled(q, k, v, mask)


def _cpu_float_lanes() -> int:
    """Float32 lanes of the narrowest CPU vector Inductor may build its kernels with here.

    x86 (AVX2 or AVX512, which Inductor may or may not pick): 8; other CPUs (NEON, VSX, ...): 4.
    """
    capability = torch.backends.cpu.get_cpu_capability()
    return 8 if capability.startswith("AVX") else 4


def flex_cpu_kernel_fault(head_dim: int, lk: int, masked: bool) -> str:
    """Why compiled CPU FlexAttention (torch 2.13) computes this shape wrong; "" when it does not.

    Its score kernel ``Q K^T`` (a 1 x 16 register-blocked micro-GEMM over each key tile) has a
    tail path for a tile width that is not a multiple of 16. When the tail is a multiple of the
    vector width V and the head dim D is a multiple of V below 24, that path still loads and
    stores a full 16 columns: it reads keys past the tile and writes 16 - tail scores past each
    row. Inside a wider buffer the extra columns are overwritten later, but when the tile fills
    its buffer (one key tile: every ``Lk`` without a block mask, ``Lk <= 128`` with one) the last
    row's extra scores land on the running softmax maximum and sum: wrong, NaN, or different
    from run to run. Measured against eager flex on AVX2 (V = 8), three inputs each (2026-11-23;
    ``tests/test_variants.py`` keeps shapes of both kinds): with D in {8, 16} and
    ``Lk % 16 == 8`` in one key tile it was wrong, masked or not, in every dtype, with one
    exception (Lq = 1, Lk = 24, every key allowed: what lies past the buffer decides, so the rule
    follows the mechanism); other D (4 to 64), other tails and an 8-column tail of a wider tile
    were right. Eager FlexAttention is right everywhere.
    """
    lanes = _cpu_float_lanes()
    tail = lk % 16
    one_tile = not masked or lk <= FlexAttention.TILE
    if head_dim % lanes or head_dim >= 24 or not tail or tail % lanes or not one_tile:
        return ""
    return (
        "compiled CPU FlexAttention computes this shape wrong (torch's score micro-kernel "
        f"writes past its buffer when head_dim D={head_dim} < 24 is a multiple of {lanes} and "
        f"its one key tile of Lk={lk} keys ends in {tail} = Lk % 16 columns); "
        "eager FlexAttention (compiled=False) is right"
    )


@functools.lru_cache(maxsize=2)
def _flex(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    # Static shapes: after a second shape, automatic dynamic shapes hit an Inductor C++ codegen bug
    # for CPU FlexAttention in torch 2.13 ("cur_kvSplitSize5 was not declared").
    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


class FlexAttention(Variant):
    """``torch.nn.attention.flex_attention`` with a block mask built from the mask predicate.

    The runner hands it the predicate (:class:`~attnbench.mask_mods.MaskMod`), whose function is
    FlexAttention's ``mask_mod`` as is; a dense boolean tensor is accepted too (read through an
    index ``mask_mod``). The block mask records which (query block, key block) tiles hold any
    allowed pair, so causal, sliding-window, prefix-LM and document masks skip empty tiles. It is
    built once per mask (in :meth:`warm_up` or the first call) and cached.

    Compiled on CPU, torch 2.13's kernel computes some small shapes wrong (head dim 8 or 16 with
    ``Lk % 16 == 8`` in one key tile: see :func:`flex_cpu_kernel_fault`); those are declared
    unsupported, so a sweep records them ``skipped`` with the reason, and the correctness gate
    still checks every shape that runs.
    """

    memory_exponent = 1.0
    source = "torch.nn.attention.flex_attention (FlexAttention, Dong et al. 2024)"
    SUPPORTED_DTYPES = _HALF_AND_FLOAT  # CPU FlexAttention rejects float64
    SCORE_BUFFERS = 0.0
    IN_DEFAULT_SWEEP = False

    RECOMPUTES_SCORES = True
    OPAQUE_KERNELS = frozenset({"flex_attention"})  # FlopCounterMode cannot run the CPU HOP at all
    # create_block_mask's default block size: FlexAttention computes whole non-empty tiles
    TILE = 128
    MASK_MODS = True  # the predicate is the block mask's mask_mod (no dense mask is built)
    SUPPORTS_GQA = GqaMode.NATIVE  # flex_attention(enable_gqa=True)

    def __init__(self, compiled: bool = True, scale: float | None = None) -> None:
        super().__init__(scale)
        # a str such as "no" is truthy: never guess
        self.compiled = check_bool("compiled", compiled)
        self._block_masks: dict[tuple, object] = {}

    def extra_reasons(self, call):
        reasons = _compiler_reasons(call.device) if self.compiled else []
        if call.backward and call.device == "cpu":
            reasons.append("FlexAttention has no backward pass on CPU")
        if self.compiled and call.device == "cuda" and min(call.d, call.dv) < _FLEX_CUDA_MIN_DIM:
            # inductor's Triton template: "NYI: embedding dimension ... must be at least 16"
            reasons.append(
                f"compiled FlexAttention on CUDA needs head dims of at least {_FLEX_CUDA_MIN_DIM} "
                f"(D={call.d}, Dv={call.dv})"
            )
        if self.compiled and call.device == "cpu":
            fault = flex_cpu_kernel_fault(call.d, call.lk, masked=call.mask_kinds != {"none"})
            reasons += [fault] if fault else []
        return reasons

    def validate(self, q, k, v, mask=None):
        mask4 = super().validate(q, k, v, mask)
        if self.compiled:
            _configure_dynamo()
        return mask4

    def scores_visible(self, spec):
        return False

    def executed_pairs(self, spec):
        """Pairs in the non-empty ``TILE x TILE`` tiles of the spec's mask, in closed form at any L.

        Matches the BlockMask's ``kv_num_blocks + full_kv_num_blocks`` (checked by the tests).
        """
        t, lq, lk = self.TILE, spec.lq, spec.lk
        if spec.mask == "none":
            return lq * lk
        if spec.mask == "valid_lengths":  # one block mask per batch element: average their tiles
            per_batch = [
                lq * max(0, min(lk, -(-n // t) * t))
                for n in masks.default_valid_lens(spec.batch, lk)
            ]
            return sum(per_batch) // spec.batch
        return mask_mods.nonempty_tile_pairs(
            spec.mask_mod(device="cpu"), spec.batch, spec.heads, lq, lk, t, t
        )

    def scratch_elements(self, spec):  # noqa: D102 - a (block x Lk) tile row and the log-sum-exp
        return spec.batch * spec.heads * (min(128, spec.lq) * spec.lk / 8 + spec.lq)

    def block_mask(
        self, mask, b: int, h: int, lq: int, lk: int, device: torch.device | str = "cpu"
    ):
        """The cached FlexAttention BlockMask of a predicate or rank-4 bool mask (None: none)."""
        if mask is None:
            return None
        from torch.nn.attention.flex_attention import create_block_mask

        from attnbench.mask_mods import MaskMod

        if isinstance(mask, MaskMod):
            # the cache holds the predicate, so its id stays unique
            key = (id(mask), b, h, lq, lk, str(device))
            if key not in self._block_masks:
                self._block_masks = {
                    key: (
                        mask,
                        create_block_mask(
                            mask.fn,
                            b if mask.uses_batch else None,
                            h if mask.uses_head else None,
                            lq,
                            lk,
                            device=device,
                        ),
                    )
                }
            return self._block_masks[key][1]
        key = (mask.data_ptr(), tuple(mask.shape), mask._version, b, h, lq, lk)
        if key not in self._block_masks:
            sb, sh, sq = (mask.shape[i] > 1 for i in range(3))

            def mask_mod(bi, hi, qi, ki):
                return mask[bi if sb else 0, hi if sh else 0, qi if sq else 0, ki]

            self._block_masks = {
                key: (
                    mask,
                    create_block_mask(
                        mask_mod, b if sb else None, h if sh else None, lq, lk, device=mask.device
                    ),
                )
            }
        return self._block_masks[key][1]

    def warm_up(self, call):
        """The first call of the timed closure builds the block mask and compiles (preparation)."""
        return _first_call(call)

    def forward(self, q, k, v, mask):
        block_mask = self.block_mask(mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device)
        return _flex(self.compiled)(
            q, k, v, block_mask=block_mask, scale=self.scale, enable_gqa=k.shape[1] != q.shape[1]
        )
