"""This GPU's speed-of-light ceilings, and the percentage of speed of light a measured case reaches.

`kbench device` measures the ceilings once per GPU model and caches them as JSON under
``$KBENCH_CACHE/ceilings/<gpu-model>.json`` (KBENCH_CACHE defaults to ``~/.cache/kbench``):
- matmul rate, FLOP/s: ``torch.matmul`` of two 8192x8192 bf16 matrices, and ``torch._scaled_mm`` of the same shape in
  fp8 with per-tensor scales (the fastest thing the vendor library does; a kernel can at best reach it);
- copy bandwidth, bytes/s: a device-to-device ``copy_`` of 1 GiB, counting the read and the write;
- with several GPUs, the NCCL all-reduce bus bandwidth of 256 MB of fp32, measured by one spawned process per GPU.

A case's floor (seconds) is ``max(flops / rate[math], bytes / copy_bw, comm_bytes / allreduce_bw if comm_bytes > 0)``
with flops, bytes and comm_bytes from the spec's roofline; ``% SOL = floor / mean * 100``.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

MATMUL_N = 8192
COPY_BYTES = 1 << 30
ALLREDUCE_BYTES = 256 * 1024 * 1024


@dataclass
class Ceilings:
    """Measured ceilings of one GPU model. Rates in FLOP/s, bandwidths in bytes/s."""
    gpu: str
    bf16_flops: float
    fp8_flops: float | None          # None where torch._scaled_mm is missing or unsupported on this GPU
    copy_bw: float                   # device-to-device copy, read + write counted
    allreduce_bw: float | None       # NCCL all-reduce bus bandwidth over `gpus` GPUs; None with one GPU
    gpus: int = 1
    torch: str = ""
    cuda: str = ""
    measured_at: str = ""

    def rate(self, math: str) -> float | None:
        """Matmul rate for a roofline's ``math``; fp16 runs at the bf16 rate on the tensor cores of H100/H200/MI300X."""
        return {"bf16": self.bf16_flops, "fp16": self.bf16_flops, "fp8": self.fp8_flops}.get(math)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Ceilings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# ----------------------------------------------------------------------------------------------------------------
# the cache

def cache_root() -> Path:
    """kbench's cache folder: $KBENCH_CACHE, else ~/.cache/kbench."""
    env = os.environ.get("KBENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kbench"


def model_slug(gpu: str) -> str:
    """A file name for a GPU model: "NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3"."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", gpu).strip("-") or "unknown-gpu"


def cache_path(gpu: str) -> Path:
    return cache_root() / "ceilings" / f"{model_slug(gpu)}.json"


def load_cached(gpu: str) -> Ceilings | None:
    """The cached ceilings of a GPU model, or None if never measured (or the file is unreadable)."""
    path = cache_path(gpu)
    try:
        return Ceilings.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def save(ceilings: Ceilings) -> Path:
    """Write the ceilings atomically (a half-written cache would poison every later % SOL)."""
    from .results_io import atomic_write_text

    path = cache_path(ceilings.gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(ceilings.to_json(), indent=2) + "\n")


def load_or_measure(refresh: bool = False, say: Callable[[str], None] = lambda s: None) -> Ceilings:
    """This GPU's ceilings: from the cache, measured (and cached) when absent or when ``refresh``.

    The all-reduce figure depends on how many GPUs are visible, so a cache written with a different count gets that one
    figure re-measured; the matmul and copy figures belong to the model and are kept.
    """
    import torch

    gpu = torch.cuda.get_device_name(0)
    count = torch.cuda.device_count()
    cached = None if refresh else load_cached(gpu)
    if cached is not None and cached.gpus == count:
        return cached
    if cached is None:
        say(f"measuring the ceilings of this {gpu} once (cached in {cache_path(gpu)}) ...")
        cached = measure_isolated()
    else:
        say(f"{count} GPUs visible (cache has {cached.gpus}): measuring the all-reduce bandwidth ...")
        cached.allreduce_bw = _try_allreduce(count, say) if count > 1 else None
        cached.gpus = count
    save(cached)
    return cached


# ----------------------------------------------------------------------------------------------------------------
# measuring

def _time_s(fn: Callable[[], Any], iters: int, repeats: int = 3) -> float:
    """Best per-call time in seconds of ``fn`` over ``repeats`` windows of ``iters`` back-to-back calls, each window
    timed with the judge's CUDA-event timer (no L2 flush: the ceilings are steady-state rates)."""
    import torch

    from .timing import Clock, cuda_event_window

    clock = Clock(sync=torch.cuda.synchronize, new_event=lambda: torch.cuda.Event(enable_timing=True),
                  record=torch.cuda.Event.record, elapsed_ms=torch.cuda.Event.elapsed_time)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()

    def window():
        for _ in range(iters):
            fn()

    return min(cuda_event_window(clock, window)[0] for _ in range(repeats)) / 1e9 / iters


def measure_matmul_bf16(n: int = MATMUL_N) -> float:
    """FLOP/s of torch.matmul on two n x n bf16 matrices."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n ** 3 / _time_s(lambda: torch.matmul(a, b), iters=20)


def measure_matmul_fp8(n: int = MATMUL_N) -> float | None:
    """FLOP/s of torch._scaled_mm (fp8, per-tensor scales, bf16 out), or None where this torch/GPU has no fp8 matmul."""
    import torch

    if not hasattr(torch, "_scaled_mm"):
        return None
    # ROCm's MI300 matmul wants AMD's fnuz variant; CUDA wants OCP e4m3fn.
    dtype = getattr(torch, "float8_e4m3fnuz" if torch.version.hip else "float8_e4m3fn", None)
    if dtype is None:
        return None
    a = torch.randn(n, n, device="cuda").to(dtype)
    b = torch.randn(n, n, device="cuda").to(dtype).t()      # the second operand must be column-major
    one = torch.ones((), device="cuda", dtype=torch.float32)
    try:
        return 2 * n ** 3 / _time_s(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                                             out_dtype=torch.bfloat16), iters=20)
    except (RuntimeError, TypeError):      # no fp8 tensor cores (pre-Hopper) or an older signature
        return None


def measure_copy(nbytes: int = COPY_BYTES) -> float:
    """Bytes/s of a device-to-device copy, counting the bytes read and the bytes written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * nbytes / _time_s(lambda: dst.copy_(src), iters=20)


def _allreduce_rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank of the all-reduce measurement (spawned); rank 0 writes the slowest rank's time to ``out``."""
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        x = torch.ones(ALLREDUCE_BYTES // 4, dtype=torch.float32, device=f"cuda:{rank}")
        dist.barrier()
        seconds = torch.tensor([_time_s(lambda: dist.all_reduce(x), iters=20)], device=f"cuda:{rank}")
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if rank == 0:
            Path(out).write_text(json.dumps({"seconds": seconds.item()}))
    finally:
        dist.destroy_process_group()


def measure_allreduce(world: int) -> float:
    """NCCL all-reduce bus bandwidth (bytes/s) of 256 MB fp32 over ``world`` GPUs: algbw * 2(n-1)/n, as nccl-tests."""
    import torch.multiprocessing as mp

    from .workers import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "allreduce.json")
        mp.spawn(_allreduce_rank, args=(world, free_port(), out), nprocs=world, join=True)
        seconds = json.loads(Path(out).read_text())["seconds"]
    return ALLREDUCE_BYTES / seconds * 2 * (world - 1) / world


def _try_allreduce(world: int, say: Callable[[str], None]) -> float | None:
    # A broken NCCL setup should cost only the communication term of % SOL, not the whole measurement.
    try:
        return measure_allreduce(world)
    except Exception as exc:  # noqa: BLE001 - spawned ranks fail in many ways (NCCL, ports, memory)
        say(f"all-reduce not measured ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        return None


def measure(say: Callable[[str], None] = lambda s: None) -> Ceilings:
    """Measure every ceiling of the GPUs visible now (the first GPU for the single-GPU figures)."""
    import torch

    torch.cuda.set_device(0)
    count = torch.cuda.device_count()
    say("bf16 matmul 8192^3 ...")
    bf16 = measure_matmul_bf16()
    say("fp8 matmul 8192^3 (torch._scaled_mm, per-tensor scales) ...")
    fp8 = measure_matmul_fp8()
    say("device-to-device copy ...")
    copy = measure_copy()
    torch.cuda.empty_cache()        # free the copy buffers before the spawned ranks allocate theirs
    allreduce = None
    if count > 1:
        say(f"NCCL all-reduce, 256 MB fp32 over {count} GPUs ...")
        allreduce = _try_allreduce(count, say)
    return Ceilings(gpu=torch.cuda.get_device_name(0), bf16_flops=bf16, fp8_flops=fp8, copy_bw=copy,
                    allreduce_bw=allreduce, gpus=count, torch=torch.__version__,
                    cuda=str(torch.version.hip or torch.version.cuda or ""),
                    measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def _measure_child(out: str) -> None:
    ceilings = measure(lambda s: print(f"kbench: {s}", file=sys.stderr, flush=True))
    Path(out).write_text(json.dumps(ceilings.to_json()))


def measure_isolated() -> Ceilings:
    """measure() in a spawned process, so the caller keeps no CUDA context or cached GPU memory for the run after."""
    import multiprocessing

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ceilings.json")
        proc = multiprocessing.get_context("spawn").Process(target=_measure_child, args=(out,))
        proc.start()
        try:
            proc.join()
        finally:
            if proc.is_alive():         # Ctrl-C while measuring: do not leave the child holding the GPU
                proc.terminate()
                proc.join()
        if proc.exitcode != 0 or not os.path.exists(out):
            raise RuntimeError(f"the measuring process failed (exit code {proc.exitcode})")
        return Ceilings.from_json(json.loads(Path(out).read_text()))


# ----------------------------------------------------------------------------------------------------------------
# speed of light

def floor_s(roofline: Any, case: Mapping[str, Any], ceilings: Ceilings) -> float | None:
    """The least time (s) a case could take on this GPU per the spec's roofline; None when no rate fits its math.

    The all-reduce term is left out when no all-reduce bandwidth was measured (one GPU), which lowers the floor.
    """
    rate = ceilings.rate(roofline.math)
    if not rate or not ceilings.copy_bw:
        return None
    terms = [roofline.flops(case) / rate, roofline.bytes(case) / ceilings.copy_bw]
    comm = roofline.comm_bytes(case)
    if comm > 0 and ceilings.allreduce_bw:
        terms.append(comm / ceilings.allreduce_bw)
    return max(terms)


def sol_percent(floor: float | None, mean_ns: float | None) -> float | None:
    """floor / mean * 100: how close a measured mean (ns) comes to the floor (s)."""
    if floor is None or not mean_ns or mean_ns <= 0:
        return None
    return floor / (mean_ns * 1e-9) * 100.0


def sol_percents(record: Any, roofline: Any, ceilings: Ceilings | None) -> dict[int, float]:
    """% SOL of each timed case of a RunRecord, keyed by case index (empty without ceilings, e.g. on a CPU)."""
    if ceilings is None or record.device != "cuda":
        return {}
    out = {}
    for result in record.cases:
        if result.mean_ns is None:
            continue
        try:
            pct = sol_percent(floor_s(roofline, result.case, ceilings), result.mean_ns)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            pct = None          # a case outside the roofline's keys (a hand-written --case) just gets no % column
        if pct is not None:
            out[result.index] = pct
    return out
