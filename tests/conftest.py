"""Test tiers: CPU tests always run; tests marked ``gpu`` skip with a reason when no CUDA GPU is present."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with a reason without one)")
    config.addinivalue_line("markers", "multigpu(n): needs at least n CUDA GPUs")


def _gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    count = _gpu_count()
    for item in items:
        if "gpu" in item.keywords and count == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine"))
        marker = item.get_closest_marker("multigpu")
        if marker is not None:
            need = marker.args[0] if marker.args else 2
            if count < need:
                item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA GPUs; this machine has {count}"))
