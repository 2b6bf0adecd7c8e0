"""Helpers the leaderboard's harness ships as ``utils.py``; staged beside every submission and reference.

Leaderboard submissions and references import these names (``from utils import make_match_reduced`` ...), so the
names and behaviour follow the official helpers. kbench adds ``get_device``: references draw their inputs on the
device it names, so the same reference runs on a GPU (``cuda`` / ``cuda:rank``) or, for CPU tests, on the CPU
(env ``KBENCH_DEVICE=cpu``).
"""
from __future__ import annotations

import os
import random
from typing import Any, Callable

import torch


def get_device(rank: int | None = None) -> torch.device:
    """The device references generate on: env KBENCH_DEVICE ("cuda" | "cpu"), default cuda when available.

    With a rank, ``cuda:rank`` (one GPU per rank, as the official multi-GPU harness does).
    """
    kind = os.environ.get("KBENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cuda", "cpu"):
        raise RuntimeError(f"KBENCH_DEVICE={kind!r}: set it to 'cuda' or 'cpu'")
    if kind == "cuda":
        return torch.device("cuda", rank if rank is not None else torch.cuda.current_device())
    return torch.device("cpu")


def set_seed(seed: int = 42) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _index_text(flat_index: int, shape: torch.Size) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return str(tuple(reversed(idx)))


def verbose_allclose(received: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-8,
                     max_print: int = 5) -> list[str]:
    """Compare like the official checker; return [] on a match, else lines describing the mismatch.

    An element fails when |received - expected| > atol + rtol * |expected| (in fp32), or when NaN / +inf / -inf appear
    in one and not the other. A shape mismatch fails at once.
    """
    if received.shape != expected.shape:
        return [f"SIZE MISMATCH: got shape {tuple(received.shape)}, expected {tuple(expected.shape)}"]
    got = received.detach().float()
    exp = expected.detach().float().to(got.device)
    diff = (got - exp).abs()
    tolerance = atol + rtol * exp.abs()
    bad = diff > tolerance
    bad |= torch.isnan(got) != torch.isnan(exp)
    bad |= torch.isposinf(got) != torch.isposinf(exp)
    bad |= torch.isneginf(got) != torch.isneginf(exp)
    # inf == inf gives a NaN difference; those positions matched above, so they are not mismatches.
    both_special = (torch.isinf(got) & torch.isinf(exp) & (got == exp)) | (torch.isnan(got) & torch.isnan(exp))
    bad &= ~both_special
    count = int(bad.sum().item())
    if count == 0:
        return []
    flat = torch.nonzero(bad.flatten()).flatten()[:max_print].tolist()
    got_flat, exp_flat = got.flatten(), exp.flatten()
    # The largest error among the finite mismatches, measured against the tolerance (ratio > 1 fails).
    finite = bad & torch.isfinite(got) & torch.isfinite(exp)
    worst = ""
    if bool(finite.any()):
        ratio = torch.where(finite, diff / tolerance, torch.zeros_like(diff)).flatten()
        j = int(ratio.argmax().item())
        worst = (f"; largest error {diff.flatten()[j].item():.4g} at {_index_text(j, bad.shape)} "
                 f"({ratio[j].item():.3g}x its tolerance atol + rtol*|reference|)")
    lines = [f"Number of mismatched elements: {count} of {bad.numel()}{worst}"]
    for i in flat:
        lines.append(f"ERROR at {_index_text(i, bad.shape)}: submission {got_flat[i].item()!r}, "
                     f"reference {exp_flat[i].item()!r}")
    if count > max_print:
        lines.append(f"... and {count - max_print} more mismatched elements.")
    return lines


def verbose_allequal(received: torch.Tensor, expected: torch.Tensor, max_print: int = 5) -> list[str]:
    """Exact comparison with the same report format as verbose_allclose."""
    return verbose_allclose(received, expected, rtol=0.0, atol=0.0, max_print=max_print)


def _type_problems(output: Any, expected: Any, where: str = "output") -> list[str]:
    """Structural checks before values: tensor vs not, dtype, device type, tuple length."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(output, torch.Tensor):
            return [f"{where}: expected a torch.Tensor, got {type(output).__name__}"]
        problems = []
        if output.dtype != expected.dtype:
            problems.append(f"{where}: dtype {output.dtype}, expected {expected.dtype}")
        if output.device.type != expected.device.type:
            problems.append(f"{where}: on device {output.device}, expected {expected.device.type}")
        return problems
    if isinstance(expected, (tuple, list)):
        if not isinstance(output, (tuple, list)) or len(output) != len(expected):
            return [f"{where}: expected a sequence of {len(expected)} items, got {type(output).__name__}"]
        return [p for i, (o, e) in enumerate(zip(output, expected)) for p in _type_problems(o, e, f"{where}[{i}]")]
    return []


def check_outputs(output: Any, expected: Any, rtol: float, atol: float) -> tuple[bool, str]:
    """Compare an output (tensor or tuple of tensors) with the expected one; (ok, message)."""
    problems = _type_problems(output, expected)
    if problems:
        return False, "; ".join(problems)
    pairs = list(zip(output, expected)) if isinstance(expected, (tuple, list)) else [(output, expected)]
    for i, (o, e) in enumerate(pairs):
        lines = verbose_allclose(o, e, rtol=rtol, atol=atol)
        if lines:
            prefix = f"output[{i}]: " if len(pairs) > 1 else ""
            return False, prefix + "\n".join(lines)
    return True, ""


def check_rank_output(output: Any, expected: torch.Tensor, rtol: float, atol: float) -> tuple[bool, str]:
    """One rank's output of a distributed problem against its expected tensor: type, dtype and the exact device
    (a rank must answer on its own GPU) first, then values; (ok, one-line message)."""
    if not isinstance(output, torch.Tensor):
        return False, f"output must be a torch.Tensor, got {type(output).__name__}"
    if output.dtype != expected.dtype:
        return False, f"output dtype is {output.dtype}; return {expected.dtype}"
    if output.device != expected.device:
        return False, f"output is on {output.device}; return it on this rank's device {expected.device}"
    reasons = verbose_allclose(output, expected, rtol=rtol, atol=atol)
    if reasons:
        return False, "mismatch found! custom implementation doesn't match reference: " + " ".join(reasons)
    return True, ""


def match_reference(data: Any, output: Any, reference: Callable[[Any], Any], rtol: float = 1e-5,
                    atol: float = 1e-8) -> tuple[bool, str]:
    """Run ``reference(data)`` and compare ``output`` with it."""
    expected = reference(data)
    return check_outputs(output, expected, rtol=rtol, atol=atol)


def make_match_reduced(reference: Callable[[Any], Any], rtol: float = 1e-5, atol: float = 1e-8):
    """A ``check_implementation(data, output)`` comparing with ``reference(data)`` at the given tolerance."""
    def check_implementation(data: Any, output: Any) -> tuple[bool, str]:
        return match_reference(data, output, reference, rtol=rtol, atol=atol)
    return check_implementation


_L2_FLUSH: dict[torch.device, torch.Tensor] = {}


def clear_l2_cache(device: torch.device | None = None) -> None:
    """Evict the GPU's L2 by writing a 256 MB buffer (the official flush); a no-op on the CPU."""
    if not torch.cuda.is_available():
        return
    device = device or torch.device("cuda", torch.cuda.current_device())
    buf = _L2_FLUSH.get(device)
    if buf is None:
        buf = _L2_FLUSH[device] = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device=device)
    buf.fill_(42)


class DeterministicContext:
    """Run a block with deterministic algorithms (references use it so reruns give identical numbers)."""

    def __enter__(self):
        self._saved = (torch.backends.cudnn.deterministic, torch.are_deterministic_algorithms_enabled())
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        return self

    def __exit__(self, *exc):
        torch.backends.cudnn.deterministic, det = self._saved
        torch.use_deterministic_algorithms(det)
        return False
