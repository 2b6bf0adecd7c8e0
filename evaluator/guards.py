"""What the harness checks and says besides values: the official clone of inputs, tensors reachable from inputs and
outputs, outputs that alias inputs, bitwise equality (for the work-left-on-a-side-stream check), and the one line
that describes an exception a submission raised.

Staged into the run directory as ``guards.py`` beside ``harness.py``; the harness sets ``torch`` when it starts.
"""
from __future__ import annotations

import os
import sys
import traceback
import types

torch = None  # set by harness.main() once torch is imported


def leaves(obj, path="data", depth=0, seen=None):
    """Yield (path, tensor) for every tensor reachable from obj; paths are stable across clones of the same data."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    seen = set() if seen is None else seen
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from leaves(x, f"{path}[{i}]", depth + 1, seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{path}[{k!r}]", depth + 1, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, types.FunctionType)):
        for k, v in vars(obj).items():
            yield from leaves(v, f"{path}.{k}", depth + 1, seen)


def clone(obj, deep: bool = False):
    """The official harness's clone (deep=False): tensors cloned (strides kept), tuples, lists and dicts recursed,
    any other object (all2all's per-rank data) passed through as it is. deep=True also copies those objects: the
    independent copy a check needs when the submission gets the originals (clone_inputs false, mla-decode)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(clone(x, deep) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone(x, deep) for x in obj)
    if isinstance(obj, dict):
        return {k: clone(v, deep) for k, v in obj.items()}
    if not deep or obj is None or isinstance(obj, (int, float, str, bool)):
        return obj
    import copy
    return copy.deepcopy(obj)


def _storage_ptr(t) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # meta / sparse tensors have no storage to share
        return 0


def bad_aliases(output, given, before) -> list[str]:
    """Input paths an output tensor shares storage with, other than a preallocated output buffer.

    An output may be the very input tensor it was handed as a buffer and wrote into (fp8-mm's zeroed ``c``,
    mla-decode's cache): same dtype, shape, strides and offset, and its contents changed during the call. Any other
    sharing (a reshaped or reinterpreted view, or input data handed back untouched) is "a view of its input".
    ``before``: the inputs as they were before the call (what the check uses), for the changed test.
    """
    owners = {}
    for path, t in leaves(given):
        ptr = _storage_ptr(t)
        if ptr:
            owners.setdefault(ptr, (path, t))
    previous = dict(leaves(before)) if before is not None else {}
    bad = set()
    for _, out in leaves(output):
        hit = owners.get(_storage_ptr(out))
        if hit is None:
            continue
        path, t = hit
        same_tensor = (out.dtype == t.dtype and out.shape == t.shape and out.stride() == t.stride()
                       and out.storage_offset() == t.storage_offset())
        prev = previous.get(path)
        written = prev is not None and prev is not t and not bitwise_equal(prev, t)
        if not (same_tensor and written):
            bad.add(path)
    return sorted(bad)


def bitwise_equal(a, b) -> bool:
    """Same shape and the same bits (NaN equals NaN), for any dtype, including fp8."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
    if as_int is None or a.is_complex():
        return bool(torch.equal(a, b))
    return bool(torch.equal(a.view(as_int), b.view(as_int)))


def describe(exc: BaseException, what: str) -> str:
    """'custom_kernel raised ValueError: msg (submission.py line 12)' from an exception; the whole traceback goes
    to the worker's log (the parent shows its tail under the verdict)."""
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    sys.stderr.flush()
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if os.path.basename(frame.filename) == "submission.py":
            where = f" (submission.py line {frame.lineno})"
            break
    root, seen = exc, {id(exc)}
    while root.__cause__ is not None and id(root.__cause__) not in seen:  # raise ... from ...: the compiler's own error
        root = root.__cause__
        seen.add(id(root))
    text = _gist(exc, header_will_do=root is not exc)
    if root is not exc:
        text += f" [caused by {type(root).__name__}: {_gist(root)}]"
    return f"{what} raised {type(exc).__name__}: {text}{where}".rstrip()


def _gist(exc: BaseException, header_will_do: bool = False) -> str:
    """The line of an exception's message that says what went wrong: the first, unless it is only a location header
    ending in ':' (Triton's CompilationError: 'at 1:0:', the source excerpt, a caret line, then the error, if any):
    then the last line that is not a caret, or the header itself where a cause will follow it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip().strip("^~")]
    if not lines:
        return ""
    if not lines[0].endswith(":") or len(lines) == 1 or header_will_do:
        return lines[0]
    return lines[-1]
