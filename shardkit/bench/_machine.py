"""What a benchmark report says about the machine and the software it ran on."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from typing import Any

import torch

__all__ = ["machine_info"]


def machine_info() -> dict[str, Any]:
    """Date, host, CPU, Python, torch (and its CUDA), shardkit, and TorchRec/FBGEMM versions
    when they are importable (side-by-side runs), for every report under benchmarks/results."""
    import shardkit

    info: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "shardkit": shardkit.__version__,
    }
    for name in ("torchrec", "fbgemm_gpu"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    return info
