"""What a measurement ran on: recorded with every row so results from many machines can mix."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess

import torch

from attnbench.measure.record import Environment


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(path: str | None = None) -> str:
    """Short hash of the checkout's HEAD, or "" outside a git repository."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=path, capture_output=True, text=True, timeout=5, check=False
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
            ["nvidia-smi", f"--id={idx}", "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout.strip()
        if out:
            driver, sm, mem = (s.strip() for s in out.split(",")[:3])
            info.update(gpu_driver=driver, gpu_clocks=f"sm {sm}, mem {mem}")
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return info


def thp_setting() -> str:
    """Kernel THP mode and whether torch asks for huge pages for large CPU tensors.

    Dense attention allocates fresh O(L^2) buffers every call; with 4 KiB pages each costs one page
    fault per page (about 66,500 faults per call for batched at L=2048, B=1, H=8), with huge pages
    about 40x fewer. Timings are only comparable under the same setting.
    """
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="utf-8") as f:
            mode = f.read().strip()
        mode = mode[mode.index("[") + 1 : mode.index("]")]
    except (OSError, ValueError):
        mode = "unknown"
    return f"kernel={mode} torch={os.environ.get('THP_MEM_ALLOC_ENABLE', '0')}"


def environment(device: str = "cpu") -> Environment:
    """Snapshot of the software and hardware a measurement runs on."""
    gpu = gpu_info(device)
    return Environment(
        hostname=socket.gethostname(),
        python=platform.python_version(),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 0,
        device_name=gpu.get("gpu_name", cpu_model()) if device.startswith("cuda") else cpu_model(),
        gpu_name=gpu.get("gpu_name", ""),
        gpu_memory_gb=gpu.get("gpu_memory_gb", ""),
        gpu_driver=gpu.get("gpu_driver", ""),
        gpu_clocks=gpu.get("gpu_clocks", ""),
        cuda=gpu.get("cuda_version", ""),
        commit=git_commit(os.path.dirname(os.path.abspath(__file__))),
        thp=thp_setting(),
    )
