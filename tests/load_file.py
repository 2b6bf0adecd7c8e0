"""The tests load benchmark scripts and kernel-side Python files, which are not part of the installed package,
straight from their paths (not registered in sys.modules, so each test file gets its own copy)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_file(path: Path, name: str):
    """The module at `path` (absolute, or relative to the repository root), executed under `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
