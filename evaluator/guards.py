"""What the harness checks besides values: the official clone of inputs, tensors reachable from inputs and outputs,
outputs that alias inputs, bitwise equality (for the work-left-on-a-side-stream check).

Staged into the run directory as ``guards.py`` beside ``harness.py``; the harness sets ``torch`` when it starts.
"""
from __future__ import annotations

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
