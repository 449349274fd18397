"""This machine's memory bandwidth: the second roof of the roofline (the first is the matmul peak).

A STREAM-like measurement with torch on float32 arrays far larger than the last-level cache (at
least ``CACHE_MULTIPLE`` x the CPU's L3 read from ``/sys``, or the GPU's L2; never below
``MIN_ARRAY_BYTES``), at the calling process's torch thread count: copy ``c = a`` counts 2 words
per element, triad ``a = b + s * c`` 3. Bytes are counted as STREAM counts them: not the
write-allocate read a CPU makes before it overwrites a cache line (real traffic is higher: copy 3
words, triad 4), so the figure is what a kernel that reads its inputs and writes its output once
can expect. Each kernel's rate is the median over timed blocks
(:func:`attnbench.measure.timer.time_call`; CUDA timed with events).

Measured once per (device, threads, torch) and cached beside the matmul peak, in
``bandwidth.json`` under :func:`attnbench.io.cache_dir`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from attnbench.io import read_json_cache, write_json_cache
from attnbench.measure.peak import cache_path
from attnbench.measure.timer import TimerConfig, time_call

__all__ = [
    "CACHE_MULTIPLE",
    "MIN_ARRAY_BYTES",
    "WORDS",
    "SCALAR",
    "Bandwidth",
    "last_level_cache_bytes",
    "array_bytes",
    "measure_bandwidth",
    "bandwidth",
]

CACHE_MULTIPLE = 4  # arrays at least this many times the last-level cache
MIN_ARRAY_BYTES = 256 * 2**20  # ... and never smaller than this
_WORD = 4  # float32
WORDS = {"copy": 2, "triad": 3}  # words moved per element, STREAM's count (no write-allocate reads)
_KERNELS = tuple(WORDS)
SCALAR = 3.0  # STREAM's triad scalar
_TIMER = TimerConfig(warmup=2, min_runs=5, min_time=0.5, max_time=5.0)


@dataclass(frozen=True)
class Bandwidth:
    """Measured bandwidth of one device, in bytes per second."""

    copy: float  # c = a: 2 words per element over the median time
    triad: float  # a = b + s * c: 3 words per element over the median time
    array_bytes: int  # bytes of each array (at least CACHE_MULTIPLE x the last-level cache)

    @property
    def roof(self) -> float:
        """The roofline's bandwidth roof (bytes/s): the triad bandwidth.

        Triad reads two streams and writes one, as attention does.
        """
        return self.triad


def last_level_cache_bytes(device: str = "cpu") -> int:
    """Bytes of the last-level cache: the GPU's L2, else the largest CPU cache (0 when unknown).

    Args:
        device: "cpu" or "cuda[:N]".
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0))
    largest = 0
    for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = size.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            largest = max(largest, int(digits) * scale)
    return largest


def array_bytes(device: str = "cpu") -> int:
    """Bytes per array: ``max(MIN_ARRAY_BYTES, CACHE_MULTIPLE x last-level cache)``, in 4 KiB."""
    want = max(MIN_ARRAY_BYTES, CACHE_MULTIPLE * last_level_cache_bytes(device))
    return -(-want // 4096) * 4096


def measure_bandwidth(device: str = "cpu", nbytes: int | None = None) -> Bandwidth:
    """Copy and triad bandwidth (bytes/s) of ``device`` on three float32 arrays of ``nbytes`` each.

    Args:
        device: "cpu" or "cuda[:N]".
        nbytes: bytes per array; default :func:`array_bytes` (tests pass less to stay quick).

    Raises:
        ValueError: ``nbytes`` is not a positive multiple of 4.
    """
    nbytes = array_bytes(device) if nbytes is None else nbytes
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0 or nbytes % _WORD:
        raise ValueError(
            f"nbytes must be a positive multiple of {_WORD} (float32 words), got {nbytes!r}"
        )
    n = nbytes // _WORD
    # (n,) each
    a, b, c = (
        torch.full((n,), value, dtype=torch.float32, device=device) for value in (1.0, 2.0, 0.0)
    )
    kernels = {
        "copy": lambda: c.copy_(a),
        "triad": lambda: torch.add(b, c, alpha=SCALAR, out=a),
    }
    rates = {}
    for name, call in kernels.items():
        samples, _ = time_call(call, device, _TIMER)
        rates[name] = WORDS[name] * _WORD * n / statistics.median(samples)
    return Bandwidth(copy=rates["copy"], triad=rates["triad"], array_bytes=nbytes)


def _key(device: str) -> str:
    return f"{device}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def _bandwidth_cache_path() -> Path:
    """The cache file: ``bandwidth.json`` beside the matmul peak's cache."""
    return cache_path().with_name("bandwidth.json")


def bandwidth(device: str = "cpu", refresh: bool = False) -> Bandwidth:
    """Cached :func:`measure_bandwidth` (measured on first use, per device, threads and torch).

    Args:
        device: "cpu" or "cuda[:N]".
        refresh: measure again even when cached.
    """
    path, key = _bandwidth_cache_path(), _key(device)
    cache = read_json_cache(path)
    entry = cache.get(key)
    if not refresh and isinstance(entry, dict):
        try:
            return Bandwidth(
                copy=float(entry["copy"]),
                triad=float(entry["triad"]),
                array_bytes=int(entry["array_bytes"]),
            )
        except (TypeError, KeyError, ValueError):
            pass  # garbled: measure again
    measured = measure_bandwidth(device)
    cache[key] = {
        "copy": measured.copy,
        "triad": measured.triad,
        "array_bytes": measured.array_bytes,
    }
    write_json_cache(path, cache)
    return measured
