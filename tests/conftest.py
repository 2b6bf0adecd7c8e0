"""Test tiers: CPU tests always run; tests marked ``gpu`` skip with a reason when no CUDA GPU is present.

Tests import the project as ``kbench``, its installed name (README: ``pip install -e ".[dev]"``); spawned workers
and the scripts some tests run import it too, so an uninstalled checkout is refused with the command that fixes it.
"""
import pytest

try:
    import kbench  # noqa: F401
except ImportError:
    raise pytest.UsageError('kbench is not installed: run `python3 -m pip install -e ".[dev]"` in the checkout') from None


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
