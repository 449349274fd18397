"""Input validation shared by every variant, the reference and the layer.

All checks run before any heavy work and raise ``TypeError`` (wrong kind of thing) or
``ValueError`` (right kind, wrong value) naming the argument and what was expected.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = [
    "check_qkv",
    "check_mask",
    "check_int",
    "check_positive_int",
    "as_4d_mask",
    "check_scale",
    "check_finite",
    "check_score_range",
    "check_seed",
    "check_number",
    "check_bool",
    "check_float_dtype",
    "cuda_present",
    "check_device_available",
]


def check_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    same_qk_dim: bool = True,
) -> None:
    """Validate ``q (B, H, Lq, D)``, ``k (B, Hkv, Lk, D)``, ``v (B, Hkv, Lk, Dv)`` and a bool mask.

    ``Hkv`` (key/value heads) must divide ``H``: query head h reads key/value head
    ``h // (H // Hkv)`` (grouped-query attention; ``Hkv = H`` is multi-head attention, ``Hkv = 1``
    multi-query).

    Args:
        q, k, v: attention inputs.
        mask: optional boolean mask broadcastable to ``(B, H, Lq, Lk)``.
        same_qk_dim: require ``q`` and ``k`` to share the last dimension (False for scoring
            functions such as additive attention that project both sides).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 (B, H, L, D), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if 0 in t.shape:
            raise ValueError(
                f"{name} must have no zero-sized dimension, got shape {tuple(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] or q.shape[1] % k.shape[1]:
        raise ValueError(
            "q, k, v must agree on batch and heads: one batch B, and k and v one head count Hkv "
            "dividing q's H (grouped-query attention; Hkv = H for multi-head), got (B, H) "
            f"{tuple(q.shape[:2])}, {tuple(k.shape[:2])}, {tuple(v.shape[:2])}"
        )
    if same_qk_dim and q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim D, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must share the key length Lk, got {k.shape[2]} and {v.shape[2]}")
    if mask is not None:
        check_mask(mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]), q.device)


def check_mask(mask: torch.Tensor, target: tuple[int, int, int, int], device: torch.device) -> None:
    """Validate a boolean mask broadcastable to ``target = (B, H, Lq, Lk)``."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}")
    if mask.device != device:
        raise ValueError(f"mask must be on the inputs' device {device}, got {mask.device}")
    if mask.dim() > 4:
        raise ValueError(f"mask must have rank <= 4, got shape {tuple(mask.shape)}")
    padded = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    for size, want in zip(padded, target, strict=True):
        if size not in (1, want):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} is not broadcastable to "
                f"(B, H, Lq, Lk) = {target}"
            )


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an int (never a bool) >= ``minimum``, else raise naming ``name``.

    Raises:
        TypeError: for anything but an int (``True`` is not 1).
        ValueError: for an int below ``minimum``.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive int, else raise naming ``name``."""
    return check_int(name, value, 1)


def as_4d_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """View a broadcastable mask as rank 4 by prepending singleton dimensions."""
    if mask is None or mask.dim() == 4:
        return mask
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def check_scale(scale: object) -> float | None:
    """Return ``scale`` as a float (or None): a finite real number > 0, never a bool.

    Raises:
        TypeError: for a bool or a non-number (``scale=True`` is not 1.0).
        ValueError: for NaN, an infinity, zero or a negative value.
    """
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(
            f"scale must be a real number or None, got {type(scale).__name__} {scale!r}"
        )
    value = float(scale)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"scale must be a finite number > 0 or None, got {scale!r}")
    return value


def _stream_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph: no value may be read on the host then.

    Reading a value (``bool``, ``float``, ``.item()``) synchronises, which a capturing stream
    refuses ("operation not permitted when stream is capturing") and which invalidates the
    capture. Capture requires CUDA initialised, so the question never initialises it.
    """
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def check_finite(**tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` naming the first tensor that holds a NaN or an infinity.

    The variants' rule for non-finite inputs: they are rejected here, in validation (outside any
    timed region), so no variant ever has to decide what NaN in a masked-out key means; the
    float64 reference, which accepts them, propagates NaN from unmasked positions only. Skipped
    while a CUDA graph is captured (:func:`_stream_capturing`): the warm-up calls that capture
    requires checked these same tensors.
    """
    if _stream_capturing():
        return
    for name, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{name} must be finite: it holds {bad} NaN/inf value(s)")


_LOG2_E = math.log2(math.e)
"""Base-2 kernels (``exp2``) fold this into the scale: their scores are this much larger."""


def check_score_range(q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
    """Raise ``ValueError`` when ``scale * q . k`` could overflow the inputs' dtype.

    A sufficient bound: ``|scale * q_i . k_j| <= scale * D * max|q| * max|k|``. Beyond the dtype's
    largest finite value a variant's scores would become inf and its output NaN while the float64
    reference stays finite, so such a call is refused before any heavy work. Kernels form more than
    the score itself: a base-2 kernel scales by ``scale * log2(e)``, and a kernel may scale q (or
    k) before the product (``chunked`` scales q once: ``scale = 3e38`` with tiny keys kept the
    scores finite but made the scaled queries inf), so the bound is the largest of those, times
    log2(e).
    """
    if _stream_capturing():  # checked in the warm-up calls before capture (see check_finite)
        return
    limit = torch.finfo(q.dtype).max
    q_max, k_max = float(q.detach().abs().amax()), float(k.detach().abs().amax())
    bound = scale * _LOG2_E * max(q.shape[-1] * q_max * k_max, q_max, k_max)
    if not bound < limit:
        raise ValueError(
            f"scale={scale:g} with these q and k could overflow {q.dtype} scores "
            "(scale * log2(e) * max(D * max|q| * max|k|, max|q|, max|k|) = "
            f"{bound:.3g} > {limit:.3g}); "
            "use a smaller scale or float64"
        )


def check_seed(seed: object) -> int:
    """Return ``seed`` if it is a non-negative int (a generator seed), else raise naming it."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be >= 0 and < 2**64 (a generator seed), got {seed}")
    return seed


def check_number(
    name: str, value: object, low: float, high: float = math.inf, *, low_open: bool = True
) -> float:
    """Return ``value`` if finite and in ``(low, high]`` (``[low, high]`` unless ``low_open``).

    Raises:
        TypeError: for anything but an int or float (a bool, a string such as ``'10'``).
        ValueError: NaN, inf, or a number outside the range, naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    inside = (value > low if low_open else value >= low) and value <= high
    if not (math.isfinite(value) and inside):
        bound = f"{'>' if low_open else '>='} {low:g}" + (
            f" and <= {high:g}" if math.isfinite(high) else ""
        )
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if a bool, else raise ``TypeError`` naming ``name`` (never truthiness)."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}"
        )
    return value


def check_float_dtype(name: str, dtype: object) -> torch.dtype:
    """Return ``dtype`` if a floating-point ``torch.dtype``, else raise ``TypeError`` naming it."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"{name} must be a floating-point torch.dtype such as torch.float64, "
            f"got {type(dtype).__name__} {dtype!r}"
        )
    if not dtype.is_floating_point:
        raise TypeError(
            f"{name} must be a floating-point torch.dtype such as torch.float64, got {dtype}"
        )
    return dtype


def cuda_present() -> bool:
    """Whether this machine has a CUDA device, asked without initialising CUDA in this process.

    ``torch.cuda.is_available()`` asks the CUDA runtime (``cudaGetDeviceCount``), which registers
    torch's fork handler: every process forked afterwards fails its first CUDA call with "Cannot
    re-initialize CUDA in forked subprocess". asv's forkserver imports the suite once and forks each
    benchmark process from it, so nothing that runs at import may ask that way.
    ``torch.cuda.device_count()`` asks NVML first and touches the runtime only where NVML cannot
    answer. Once CUDA is initialised here, torch's own answer is taken.
    """
    if torch.cuda.is_initialized():
        return torch.cuda.is_available()
    return torch.cuda.device_count() > 0


def check_device_available(name: str, device: torch.device | str) -> None:
    """Raise ``ValueError`` naming ``name`` if ``device`` is CUDA and this machine has none.

    Torch's own answer is an ``AssertionError`` ("Torch not compiled with CUDA enabled") from deep
    inside the first allocation.
    """
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(
            f"{name}={str(device)!r}: attnbench runs on 'cpu' and 'cuda' devices, not {kind!r}"
        )
    if kind == "cuda" and not cuda_present():
        raise ValueError(
            f"{name}={str(device)!r} needs CUDA, which is not available on this machine; use 'cpu'"
        )
