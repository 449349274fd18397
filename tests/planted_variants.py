"""Planted faulty variants, registered when this module is imported (as a plugin: ATTNBENCH_PLUGINS).

Each one is batched attention that misbehaves in ``forward`` the way a real kernel can: it hangs,
aborts, segfaults, is killed like the kernel's OOM killer kills, allocates far beyond its model, does its
work twice, or returns a wrong result.
``PLANTED_PID_FILE`` (environment) makes ``planted_pid`` append its process id, so a test can see
that every case ran in a process of its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

import torch

import attnbench
from attnbench.variants.batched import BatchedAttention


class _Planted(BatchedAttention):
    IN_DEFAULT_SWEEP = False


class Hang(_Planted):
    def forward(self, q, k, v, mask):
        while True:
            time.sleep(1)


class Abort(_Planted):
    def forward(self, q, k, v, mask):
        os.abort()


class Segfault(_Planted):
    def forward(self, q, k, v, mask):
        ctypes.string_at(0)  # reads address 0: SIGSEGV


class OomKilled(_Planted):
    def forward(self, q, k, v, mask):
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does


class Hog(_Planted):
    def forward(self, q, k, v, mask):
        hog = torch.empty(8 * 2**30, dtype=torch.uint8)  # 8 GiB, far beyond the declared model
        del hog
        return super().forward(q, k, v, mask)


class Pid(_Planted):
    def forward(self, q, k, v, mask):
        path = os.environ.get("PLANTED_PID_FILE")
        if path:
            with open(path, "a", encoding="ascii") as f:
                f.write(f"{os.getpid()}\n")
        return super().forward(q, k, v, mask)


class Twice(_Planted):
    """Right, and twice the work: its forward runs twice (what a planted 2x regression looks like)."""

    def forward(self, q, k, v, mask):
        super().forward(q, k, v, mask)
        return super().forward(q, k, v, mask)


class Off(_Planted):
    """Wrong by 10% everywhere: the correctness gate refuses it."""

    def forward(self, q, k, v, mask):
        return 1.1 * super().forward(q, k, v, mask)


PLANTED = {
    "planted_twice": Twice,
    "planted_off": Off,
    "planted_hang": Hang,
    "planted_abort": Abort,
    "planted_segv": Segfault,
    "planted_oomkill": OomKilled,
    "planted_hog": Hog,
    "planted_pid": Pid,
}
for _name, _cls in PLANTED.items():
    if _name not in attnbench.variant_names():
        attnbench.register(_name, _cls)
