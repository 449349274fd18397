"""What a measurement ran on: recorded with every row so results from many machines can mix."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess

import torch

from attnbench.measure.record import Environment
from attnbench.measure.regime import thp_setting

__all__ = ["gpu_info", "environment"]


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit(path: str | None = None) -> str:
    """Short hash of the checkout's HEAD, or "" outside a git repository."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=path,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def gpu_info(device: str) -> dict[str, str]:
    """Name, memory, driver and clocks (as nvidia-smi reads them) of the CUDA device, if any."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {}
    idx = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(idx)
    info = {
        "gpu_name": props.name,
        "gpu_memory_gb": f"{props.total_memory / 2**30:.1f}",
        "cuda_version": str(torch.version.cuda),
        "gpu_driver": "",
        "gpu_clocks": "",
    }
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                f"--id={idx}",
                "--query-gpu=driver_version,clocks.sm,clocks.mem",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        if out:
            driver, sm, mem = (s.strip() for s in out.split(",")[:3])
            info.update(gpu_driver=driver, gpu_clocks=f"sm {sm}, mem {mem}")
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return info


def environment(device: str = "cpu") -> Environment:
    """Snapshot of the software and hardware a measurement runs on."""
    gpu = gpu_info(device)
    return Environment(
        hostname=socket.gethostname(),
        python=platform.python_version(),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count() or 0,
        device_name=(
            gpu.get("gpu_name", _cpu_model()) if device.startswith("cuda") else _cpu_model()
        ),
        gpu_name=gpu.get("gpu_name", ""),
        gpu_memory_gb=gpu.get("gpu_memory_gb", ""),
        gpu_driver=gpu.get("gpu_driver", ""),
        gpu_clocks=gpu.get("gpu_clocks", ""),
        cuda=gpu.get("cuda_version", ""),
        commit=_git_commit(os.path.dirname(os.path.abspath(__file__))),
        thp=thp_setting(),
    )
