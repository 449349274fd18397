"""A plain attention function as a variant: the adapters that let the engine call it unchanged.

:func:`wrap` turns ``fn`` into a :class:`Kernel`, a :class:`~attnbench.Variant` whose declared
support (masks, grouped-query attention, Lq != Lk, backward) is what the caller states, so the
answer check, the cost assertions, ``attnbench run`` and asv all call it through the one contract
(``q (B, H, Lq, D)``, ``k, v (B, Hkv, Lk, D|Dv)``, a bool mask, output ``(B, H, Lq, Dv)``). The
adapter (``call``) says how that contract reaches ``fn``:

* ``"attnbench"``: ``fn(q, k, v, mask)``, this project's own call (the mask a rank-4 bool tensor
  broadcastable to ``(B, H, Lq, Lk)``, True = may attend, or None);
* ``"sdpa"``: ``fn(q, k, v, attn_mask=None, is_causal=False, scale=None)``, the signature of
  ``torch.nn.functional.scaled_dot_product_attention``: the causal kind goes as ``is_causal=True``
  (no mask tensor is built), every other kind as a bool ``attn_mask``;
* ``"hf"``: ``fn(module, query, key, value, attention_mask, scaling=..., dropout=0.0)`` returning
  ``(out (B, Lq, H, Dv), weights)``, the interface of Hugging Face transformers' attention
  functions: ``module`` carries ``num_key_value_groups``, ``is_causal=False`` and
  ``training=False``; the mask goes as the additive float mask (0 where allowed, the dtype's most
  negative value elsewhere) those functions are given by a model.

``layout="blhd"`` hands ``fn`` ``(B, L, H, D)`` tensors and reads its output as ``(B, Lq, H, Dv)``
(views, no copy; the mask keeps its ``(B, H, Lq, Lk)`` form). Every conversion of the mask happens
in :meth:`Kernel.validate`, before the measured call, as the runner does for built-in variants.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import torch

from attnbench import mask_mods
from attnbench import masks as mask_kinds
from attnbench._checks import as_4d_mask
from attnbench.reference import repeat_kv
from attnbench.registry import NAME, get_variant, register, variant_names
from attnbench.spec import DTYPES, AttnSpec
from attnbench.variants.base import FLOAT_DTYPES, GqaMode, Variant

__all__ = [
    "CALLS",
    "LAYOUTS",
    "ENV_LENGTHS",
    "ENV_DEVICE",
    "DEFAULT_LENGTHS",
    "Kernel",
    "wrap",
    "as_variant",
    "default_lengths",
    "default_device",
    "spec_text",
]

CALLS: tuple[str, ...] = ("attnbench", "sdpa", "hf")
"""How a wrapped function is called (see the module docstring)."""
LAYOUTS: tuple[str, ...] = ("bhld", "blhd")
"""The tensor layouts a wrapped function may take: ``(B, H, L, D)`` or ``(B, L, H, D)``."""
ENV_LENGTHS = "ATTNBENCH_TEST_LENGTHS"
"""Comma-separated lengths the cost checks use by default (the pytest option sets it)."""
ENV_DEVICE = "ATTNBENCH_TEST_DEVICE"
"""The device the checks use by default (the pytest option sets it; unset: ``cpu``)."""
DEFAULT_LENGTHS: tuple[int, ...] = (512, 1024, 2048, 4096)
"""Four lengths, a factor 8: what the growth fit needs (three or more), in a few seconds."""
_GQA = {False: "", True: GqaMode.NATIVE, "native": GqaMode.NATIVE, "repeat": GqaMode.REPEAT}


class _HFModule(torch.nn.Module):
    """The attention module a transformers attention function reads its settings from."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = False  # the mask says what is allowed, never a default
        self.layer_idx = 0
        self.train(False)


class Kernel(Variant):
    """A plain function under the variant contract; build one with :func:`wrap`.

    The declarations (``SUPPORTED_MASKS``, ``SUPPORTS_GQA``, ...) are set per instance from what
    :func:`wrap` was told, so :meth:`~attnbench.Variant.not_supported_reasons` answers for this
    function. It has no cost model of its own: the dense one of :class:`~attnbench.Variant` stands
    for it where the engine plans (the budget guard), and its executed FLOPs are reported as an
    upper bound (:meth:`executed_flops_unknown`); :mod:`attnbench.testing` counts them instead.
    """

    source = "a wrapped function (attnbench.testing.wrap)"
    IN_DEFAULT_SWEEP = False  # measured when named with --variants

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        call: str = "attnbench",
        layout: str = "bhld",
        masks: Iterable[str] = ("none",),
        gqa: bool | str = False,
        cross: bool = True,
        backward: bool = True,
        devices: Iterable[str] = ("cpu", "cuda"),
        dtypes: Iterable[str] = tuple(sorted(FLOAT_DTYPES)),
        scale: float | None = None,
    ) -> None:
        super().__init__(scale=scale)
        self.fn = fn
        self.call, self.layout, self.gqa = call, layout, gqa
        self.SUPPORTED_MASKS = frozenset(masks)
        self.SUPPORTS_GQA = _GQA[gqa]
        self.SUPPORTS_CROSS, self.SUPPORTS_BACKWARD = cross, backward
        self.SUPPORTED_DEVICES, self.SUPPORTED_DTYPES = frozenset(devices), frozenset(dtypes)
        self.MASK_MODS = True  # the runner hands over the predicate (see takes_mask_mod)
        self._prepared: tuple[torch.Tensor, torch.Tensor] | None = None  # bool, additive

    def __repr__(self) -> str:
        where = f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"
        masks_ = tuple(m for m in mask_kinds.MASK_KINDS if m in self.SUPPORTED_MASKS)
        return (
            f"wrap({where}, name={self.name!r}, call={self.call!r}, layout={self.layout!r}, "
            f"masks={masks_!r}, gqa={self.gqa!r}, cross={self.SUPPORTS_CROSS}, "
            f"backward={self.SUPPORTS_BACKWARD})"
        )

    @property
    def options(self) -> dict[str, Any]:
        """The keyword arguments that build this kernel again (what :meth:`register` stores)."""
        return dict(
            fn=self.fn,
            call=self.call,
            layout=self.layout,
            masks=tuple(sorted(self.SUPPORTED_MASKS)),
            gqa=self.gqa,
            cross=self.SUPPORTS_CROSS,
            backward=self.SUPPORTS_BACKWARD,
            devices=tuple(sorted(self.SUPPORTED_DEVICES)),
            dtypes=tuple(sorted(self.SUPPORTED_DTYPES)),
            scale=self.scale,
        )

    def register(self) -> Kernel:
        """Register this kernel under its name, for ``attnbench run --variants`` and asv.

        A measuring process (a sweep's worker, asv's benchmark process) knows the name only when
        it imports the module that registers it: name that module with ``--plugin`` or
        ``ATTNBENCH_PLUGINS``. Registering the same name again is an error, as it is for
        :func:`attnbench.register`.
        """
        register(self.name, Kernel, **self.options)
        return self

    def takes_mask_mod(self, mod: mask_mods.MaskMod | None) -> bool:
        """Always: the predicate names its kind, which the declared ``masks`` are judged against.

        (A dense tensor may encode any mask, so it would need general support.) :meth:`validate`
        then builds the form ``fn`` takes.
        """
        return mod is not None

    def validate(self, q, k, v, mask=None):
        """The contract's checks, then the mask in the form ``fn`` takes (outside the call).

        A predicate becomes the dense bool tensor (rank 4, keys at full length), except the causal
        kind for the SDPA adapter (``is_causal=True``). For the transformers adapter it also
        makes the additive float mask a model hands its attention function, which
        :meth:`forward` then passes for this bool mask.
        """
        mask = super().validate(q, k, v, mask)
        if isinstance(mask, mask_mods.MaskMod):
            if self.call == "sdpa" and mask_kinds.kind_of(mask) == "causal":
                return mask
            b, h, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
            dense = as_4d_mask(mask_mods.dense(mask, b, h, lq, lk, q.device))
            mask = dense.expand(*dense.shape[:3], lk)
        if self.call == "hf" and isinstance(mask, torch.Tensor):
            # made here, outside the measured call; the gate still reads the bool mask
            self._prepared = (mask, _additive(mask, q.dtype))
        return mask

    def executed_flops_unknown(self, spec: AttnSpec) -> str:
        return (
            f"{self.name} is a wrapped function without a cost model: its executed FLOPs are the "
            "dense upper bound (attnbench.testing counts them with FlopCounterMode)"
        )

    def forward(self, q, k, v, mask):
        if self.SUPPORTS_GQA == GqaMode.REPEAT:
            k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        if self.call == "hf":
            module = _HFModule(q.shape[1] // k.shape[1])
            scaling = self.scale_for(q.shape[-1])
            if isinstance(mask, torch.Tensor):
                made = self._prepared
                mask = made[1] if made is not None and made[0] is mask else _additive(mask, q.dtype)
            out, _ = self.fn(module, q, k, v, mask, scaling=scaling, dropout=0.0)
            return out.transpose(1, 2)  # (B, Lq, H, Dv) -> (B, H, Lq, Dv)
        if self.layout == "blhd":
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, L, H, D) views
        out = self._call(q, k, v, mask)
        return out.transpose(1, 2) if self.layout == "blhd" else out

    def _call(self, q, k, v, mask):
        if self.call == "attnbench":
            return self.fn(q, k, v, mask)
        extra = {} if self.scale is None else {"scale": self.scale}
        if isinstance(mask, mask_mods.MaskMod):  # the causal kind (validate)
            return self.fn(q, k, v, attn_mask=None, is_causal=True, **extra)
        return self.fn(q, k, v, attn_mask=mask, is_causal=False, **extra)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``mask`` allows, the dtype's most negative value elsewhere (same shape)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min
    )


def wrap(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    call: str = "attnbench",
    layout: str = "bhld",
    masks: Iterable[str] = ("none",),
    gqa: bool | str = False,
    cross: bool = True,
    backward: bool = True,
    devices: Iterable[str] = ("cpu", "cuda"),
    dtypes: Iterable[str] = tuple(sorted(FLOAT_DTYPES)),
    scale: float | None = None,
    register: bool = False,
) -> Kernel:
    """``fn`` as a variant that the checks, ``attnbench run`` and asv can call.

    Args:
        fn: the attention function (see the module docstring for what each ``call`` passes it).
        name: its variant name (default: ``fn.__name__``); letters, digits, ``_ . -``.
        call: ``"attnbench"``, ``"sdpa"`` or ``"hf"`` (:data:`CALLS`).
        layout: ``"bhld"`` or ``"blhd"`` (:data:`LAYOUTS`; ``"hf"`` takes ``"bhld"`` only).
        masks: the mask kinds ``fn`` answers right (of :data:`attnbench.masks.MASK_KINDS`).
        gqa: grouped-query attention: False (not supported), True (``fn`` reads each key/value
            head for its query heads itself) or ``"repeat"`` (the adapter repeats k and v first).
        cross: ``fn`` takes Lq != Lk.
        backward: ``fn`` is differentiable (the checks then test its gradients too).
        devices, dtypes: where and at which precisions it runs.
        scale: the score multiplier ``fn`` is given and checked with (None: ``1 / sqrt(D)``,
            which ``fn`` must then apply itself).
        register: also register it under ``name`` (:meth:`Kernel.register`).

    Raises:
        TypeError, ValueError: naming the argument, for anything above out of its range.
    """
    options = dict(
        call=call,
        layout=layout,
        masks=_kinds(masks),
        gqa=gqa,
        cross=cross,
        backward=backward,
        devices=_checked_set("devices", devices, ("cpu", "cuda")),
        dtypes=_checked_set("dtypes", dtypes, tuple(DTYPES)),
        scale=scale,
    )
    _check_call(fn, call, layout, gqa, cross, backward)
    kernel = Kernel(fn, **options)
    kernel.name = _name(fn, name)
    return kernel.register() if register else kernel


def _check_call(fn: object, call: str, layout: str, gqa: object, cross: object, back: object):
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if call not in CALLS:
        raise ValueError(f"call must be one of {CALLS}, got {call!r}")
    if layout not in LAYOUTS or (call == "hf" and layout != "bhld"):
        allowed = ("bhld",) if call == "hf" else LAYOUTS
        raise ValueError(f"layout must be one of {allowed} for call={call!r}, got {layout!r}")
    if not isinstance(gqa, (bool, str)) or gqa not in _GQA:
        raise ValueError(f"gqa must be False, True, 'native' or 'repeat', got {gqa!r}")
    for arg, value in (("cross", cross), ("backward", back)):
        if not isinstance(value, bool):
            raise TypeError(f"{arg} must be a bool, got {value!r}")


def _kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    return _checked_set("masks", kinds, mask_kinds.MASK_KINDS)


def _checked_set(arg: str, values: Iterable[str], allowed: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise TypeError(f"{arg} must be a collection of names, got the string {values!r}")
    chosen = tuple(values)
    unknown = [v for v in chosen if v not in allowed]
    if not chosen or unknown:
        raise ValueError(f"{arg} must name at least one of {allowed}, got {chosen!r}")
    return chosen


def _name(fn: Callable[..., Any], name: str | None) -> str:
    name = getattr(fn, "__name__", "") if name is None else name
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(
            "name must be letters, digits, '_', '.' or '-' (starting with a letter or '_'), "
            f"got {name!r}"
        )
    return name


def as_variant(kernel: Variant | str) -> Variant:
    """A :class:`Kernel` or any variant as is; a registered name built (``"sdpa"``, ``"batched"``).

    Raises:
        TypeError: for anything else; ValueError: for an unknown name (listing the known ones).
    """
    if isinstance(kernel, Variant):
        return kernel
    if isinstance(kernel, str):
        return get_variant(kernel)
    raise TypeError(
        f"kernel must be a wrapped function (attnbench.testing.wrap), a Variant or a registered "
        f"variant's name (one of {', '.join(variant_names())}), got {type(kernel).__name__}"
    )


def default_lengths(lengths: Iterable[int] | None = None) -> tuple[int, ...]:
    """``lengths``, else ``ATTNBENCH_TEST_LENGTHS``, else :data:`DEFAULT_LENGTHS`; at least 3.

    Raises:
        ValueError: fewer than three distinct lengths, or one that is not an int >= 1.
    """
    if lengths is None:
        raw = os.environ.get(ENV_LENGTHS, "").strip()
        lengths = [int(x) for x in raw.split(",") if x.strip()] if raw else DEFAULT_LENGTHS
    chosen = tuple(lengths)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in chosen):
        raise ValueError(f"lengths must be ints >= 1, got {chosen!r}")
    if len(set(chosen)) < 3:
        raise ValueError(f"lengths must hold three distinct lengths or more, got {chosen!r}")
    return tuple(sorted(set(chosen)))


def default_device(device: str | None = None) -> str:
    """``device``, else ``ATTNBENCH_TEST_DEVICE``, else ``"cpu"``."""
    return device or os.environ.get(ENV_DEVICE, "").strip() or "cpu"


def spec_text(spec: AttnSpec) -> str:
    """``AttnSpec(seq_len=67, mask='causal')``: the fields that differ from the defaults."""
    default = AttnSpec()
    fields = [
        f"{f}={getattr(spec, f)!r}"
        for f in spec.__dataclass_fields__
        if getattr(spec, f) != getattr(default, f)
    ]
    return f"AttnSpec({', '.join(fields)})"
