"""Symmetric memory for the distributed CUDA backends: one buffer per process (grown when a call needs more) that
every rank maps, with the peers' addresses. torch.distributed's symmetric memory allocates it, rendezvous maps the
peers' buffers; NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1). Allocation is collective: every
rank reaches it in the same call, as every rank calls custom_kernel together.

Layout the backends share: the first FLAG_BYTES hold uint32 flags (zeroed once), data follows.
"""
import os
import warnings

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

FLAG_BYTES = 4096
MIN_BYTES = 320 << 20  # the largest official gemm-rs / ag-gemm case needs ~270 MB: one allocation serves them all
_buffers = {}  # device -> (tensor, handle, peer addresses)
_views = {}    # (device, rank, offset, shape, dtype) -> a tensor over that rank's buffer
_retired = []  # buffers outgrown: kept mapped, since a peer's last call may still be writing into them


def _rendezvous(t: torch.Tensor):
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        try:
            with warnings.catch_warnings():  # torch >= 2.11 enables every group itself and warns that it does
                warnings.simplefilter("ignore", FutureWarning)
                enable(group.group_name)
        except Exception:  # noqa: BLE001 - newer torch enables every group by itself
            pass
    try:
        return symm_mem.rendezvous(t, group)
    except TypeError:  # torch that takes the group's name
        return symm_mem.rendezvous(t, group.group_name)


def buffer(nbytes: int, device: torch.device):
    """(uint8 tensor of at least nbytes + FLAG_BYTES, peer addresses [world_size]) for this process's device."""
    have = _buffers.get(device)
    if have is None or have[0].numel() < nbytes + FLAG_BYTES:
        import torch.distributed._symmetric_memory as symm_mem

        if have is not None:
            _retired.append(have)
        size = max(nbytes + FLAG_BYTES, MIN_BYTES)
        t = symm_mem.empty(size, dtype=torch.uint8, device=device)
        handle = _rendezvous(t)
        t[:FLAG_BYTES].zero_()
        torch.cuda.synchronize(device)
        dist.barrier()  # every rank's flags are zero before any rank can write one
        have = _buffers[device] = (t, handle, [int(p) for p in handle.buffer_ptrs])
    return have[0], have[2]


def half(nbytes: int, parity: int, device: torch.device) -> tuple[int, list]:
    """(byte offset of half `parity` of this process's buffer, the peers' addresses), each half at least nbytes.

    Calls alternate halves by parity. The halves are fixed for the buffer's life whatever each call needs, so a
    call writing its half never touches the other half, which a peer may still be reading from the call before
    (a case with a smaller size would otherwise place its region over the previous call's)."""
    need = -(-nbytes // 256) * 256
    t, peers = buffer(2 * need, device)
    size = (t.numel() - FLAG_BYTES) // 2 // 256 * 256
    return FLAG_BYTES + parity * size, peers


def plan_args(nbytes: int, device: torch.device) -> tuple[list, int, int, int, int]:
    """What a binding's one-call plan of calls needing `nbytes` a half holds (kernels/_common/peer_binding.h
    kbpeer::Plan): (the peers' addresses, this rank's flag words, half 0's byte offset, the size of a half, this
    rank). A collective where the buffer grows, as half is. A buffer outgrown later stays mapped, so a plan made on it
    stays valid: calls on two buffers keep the halves' rule, since a rank's writes of call N + 2 follow in its stream
    its wait of call N + 1 for every peer's flag, which each peer raised after its reads of call N."""
    half0, peers = half(nbytes, 0, device)
    half1, _ = half(nbytes, 1, device)
    return peers, flags_address(device), half0, half1 - half0, dist.get_rank()


def view(device: torch.device, rank: int, offset: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over rank `rank`'s buffer (this process's mapping of it) at byte `offset` (after the flags):
    writes go straight to that GPU (over NVLink for a peer), as a kernel or a copy engine performs them."""
    t, handle, _ = _buffers[device]
    key = (device, rank, offset, tuple(shape), dtype, t.data_ptr())
    v = _views.get(key)
    if v is None:
        if len(_views) > 4096:
            _views.clear()
        elem = torch.empty((), dtype=dtype).element_size()
        assert offset % elem == 0, "a view must start at a multiple of its element size"
        v = _views[key] = handle.get_buffer(rank, tuple(shape), dtype, offset // elem)
    return v


def flags_address(device: torch.device) -> int:
    """The address of this rank's flag words (the start of its buffer)."""
    return _buffers[device][0].data_ptr()
