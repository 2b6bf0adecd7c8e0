"""One CUDA graph launch in place of a call's many small launches, replayed while its tensors stay where they were.

Why: the single-GPU problems are timed with a host clock around the call, so a call of ~20 torch ops and kernels
pays their host issue time (5-10 us each) wherever the GPU outruns the host. A captured graph issues them all at
once. A replay reads whatever the tensors at the captured addresses hold at that moment, so it recomputes the whole
result from the current inputs; what it cannot follow is a tensor moved to another address, a new shape, or a host
value baked into a launch. Those make up the key: tensors by (address, shape, strides, dtype), host values as they
are. Values that change every call (a growing cache length) must reach the kernels through device memory instead.

A call whose key has no graph runs eagerly; then, while captures pay off, the same step is captured for the next call
(host time only, no GPU work: on the harness's untimed first call of a case, not in a timed one). A capture that
is never replayed shows inputs that move every call (fresh allocations): from then on a key is captured only when
it comes again within `keep` calls, so such a caller pays for no further captures, while inputs that come back at a
few addresses in turn are still served (leaderboard mode's regenerated moe inputs settle into two alternating sets
after a few runs: notes). At most `keep` graphs are held (each holds its intermediates in a private memory pool).
"""
import collections
import functools
import os
import weakref
from typing import Callable, Hashable, Sequence

import torch

# torch >= 2.7 hands out a captured graph's executable (raw_cuda_graph_exec), so a binding can hold and launch it
# itself (held_graphs.h); older ones replay from Python only, where nothing can reach a graph after its launch
BINDING_LAUNCHES = hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec")

# os.environ.get costs ~1 us a name (it encodes the name and decodes the value); the mapping behind it is a dict
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


def tensor_key(*tensors: torch.Tensor) -> tuple:
    """What a graph that reads `tensors` depends on: address, shape, strides and dtype of each."""
    return tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in tensors)


@functools.lru_cache(maxsize=None)
def _encoded(names: tuple) -> tuple:
    return tuple(os.fsencode(n) for n in names)


# a knob's "0" and "1" as env_values returns them: bytes where it reads os.environ's own dict, str elsewhere
OFF, ON = (b"0", "0"), (b"1", "1")


def env_values(names: tuple) -> tuple:
    """The environment's values of `names` (None where unset), for a key: as raw bytes where the platform keeps them
    so (read straight from os.environ's dict, ~20x faster than os.environ.get, which matters on a host-timed call)."""
    if isinstance(_ENV_DATA, dict):
        return tuple(map(_ENV_DATA.get, _encoded(names)))
    return tuple(map(os.environ.get, names))


class InputKey:
    """tensor_key(*tensors) + extra, recomputed only when the inputs are not the previous call's tensor objects at
    the same addresses (benchmark mode hands the same objects call after call): ~2 us instead of ~6-30 us of host
    time before the graph launches. Same objects at the same addresses are taken to keep their shapes and strides
    (the harness never resizes or restrides an input in place)."""

    def __init__(self):
        self._refs: list = []
        self._ptrs: list = []
        self._extra: tuple | None = None
        self._key: tuple | None = None

    def __call__(self, tensors: Sequence[torch.Tensor], extra: tuple = ()) -> tuple:
        if (extra == self._extra and len(tensors) == len(self._refs)
                and all(r() is t for r, t in zip(self._refs, tensors))
                and [t.data_ptr() for t in tensors] == self._ptrs):
            return self._key
        self._key = tensor_key(*tensors) + extra
        self._refs = [weakref.ref(t) for t in tensors]
        self._ptrs = [t.data_ptr() for t in tensors]
        self._extra = extra
        return self._key


def addresses(tensors: Sequence[torch.Tensor]) -> tuple:
    """The data addresses of `tensors`: a launch key for GraphReplay.replay(..., verify=...) (~0.05 us a tensor where
    tensor_key takes ~0.3)."""
    return tuple(map(torch.Tensor.data_ptr, tensors))


class GraphReplay:
    """`replay(key, step)` returns step()'s output (a tensor or a tuple of tensors), from a replayed graph of step when
    it has one for key. step must launch on the current stream (or on side streams that wait for it and that it
    waits for before returning), never synchronise, and read nothing the key leaves out. The output of a replay is
    the graph's own buffers, overwritten by the next replay: callers that hand it out clone it (`replayed` says
    whether it came from a graph), or read it on the current stream before the next replay.

    `replay(key, step, verify)` for inputs that are new objects every call (a harness that clones them) with many
    tensors: key may then be what can be read quickly (their addresses, `addresses`) and verify() returns the rest
    (their tensor_key). A capture stores verify()'s value; a replay launches on key alone and only then, while the
    GPU runs, compares verify() with it: on a difference the host waits for the launch, drops the graph and runs
    step() eagerly, whose output is returned. (A graph launched on inputs whose shapes changed at the same
    addresses reads them with the captured shapes before its output is thrown away.)

    `replay(key_fn, step, ...)` with a function for key: where this object holds no graph (nothing to look up: a
    binding holds the late graphs), step() runs before key_fn() is called, so an eager call's launches are not kept
    waiting for the key (leaderboard mode's eager calls: its inputs move every run).

    `replay(..., on_capture=f)`: f(graph, output) gets each new capture and its output buffers, for a binding that
    holds it and launches it itself in later calls (`held_graphs.h`: one extension call from the call to the
    launch); that caller then tells this object with `replayed_elsewhere()`. Where f returns True, only that caller
    may launch the graph (it hands the graph a value after the launch): this object keeps no copy to replay."""

    def __init__(self, keep: int = 2, recur: int | None = None):
        self._graphs: collections.OrderedDict = collections.OrderedDict()  # key -> (CUDAGraph, output, verify())
        self.keep = keep  # (also how many of this object's graphs a binding holds: held_graphs.h)
        # distrusted, a key is captured when it comes back within `recur` eager calls (KBENCH_GRAPH_RECUR=1: only
        # twice in a row, the policy before leaderboard mode's alternating inputs were seen)
        recur = recur or int(os.environ.get("KBENCH_GRAPH_RECUR") or keep)
        self._recent_eager: collections.deque = collections.deque(maxlen=max(1, recur))  # keys run eagerly
        self._unreplayed: Hashable = None  # the newest capture, until it is replayed
        self._trusted = True               # captures have paid off (or none has failed to yet)
        self._stream = None                # capture needs a stream other than the legacy default
        self.replayed = False              # whether the last replay() returned a graph's buffers (else step()'s)

    def replay(self, key: Hashable | Callable[[], Hashable], step: Callable[[], torch.Tensor],
               verify: Callable[[], Hashable] | None = None,
               on_capture: Callable[[torch.cuda.CUDAGraph, object], object] | None = None) -> torch.Tensor:
        self.replayed = False
        if callable(key):  # read only where needed: holding no graph to look up, step() launches first
            if not self._graphs:
                out = step()
                return self._after_eager(key(), out, step, verify, on_capture)
            key = key()
        held = self._graphs.get(key)
        if held is not None:
            self._graphs.move_to_end(key)
            held[0].replay()
            if verify is None or verify() == held[2]:
                self._unreplayed, self._trusted = None, True
                self.replayed = True
                return held[1]
            # same addresses, other tensors: this graph's output is not the answer. Its pool may be freed only once
            # the launch has finished (the eager step's allocations could land there).
            torch.cuda.current_stream().synchronize()
            del self._graphs[key]
            return step()
        return self._after_eager(key, step(), step, verify, on_capture)

    def _after_eager(self, key: Hashable, out, step: Callable[[], torch.Tensor],
                     verify: Callable[[], Hashable] | None,
                     on_capture: Callable[[torch.cuda.CUDAGraph, object], object] | None):
        """After an eager step() for key (no graph held for it): capture it where captures pay off; returns out."""
        if self._unreplayed is not None:  # the previous capture never ran: inputs move between calls
            self._unreplayed, self._trusted = None, False
        came_back = key in self._recent_eager
        if self._trusted or came_back:
            graph, graph_out = self._capture(key, step, verify)
            if came_back:
                self._recent_eager.remove(key)
            # (a caller that launches the graph itself: its output is graph_out's buffers)
            if on_capture is not None and on_capture(graph, graph_out) is True:
                del self._graphs[key]
        else:
            self._recent_eager.append(key)
        return out

    def capture_beside(self, step: Callable[[], torch.Tensor]) -> tuple:
        """(graph, output) of step captured on this object's stream, for a binding to hold; this object keeps no
        copy (an on_capture that wants a second graph of the same call: mla-decode's, notes finding 51)."""
        # torch.cuda.graph() would also empty the allocator's cache (slow for the caller's next allocations)
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        self._stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self._stream):
            graph.capture_begin()
            try:
                out = step()
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(self._stream)
        return graph, out

    def _capture(self, key: Hashable, step: Callable[[], torch.Tensor],
                 verify: Callable[[], Hashable] | None) -> tuple:
        graph, out = self.capture_beside(step)
        self._graphs[key] = (graph, out, verify() if verify is not None else None)
        self._unreplayed = key
        while len(self._graphs) > self.keep:
            self._graphs.popitem(last=False)
        return graph, out

    def replayed_elsewhere(self) -> None:
        """A caller launched this object's newest capture itself (its raw executable graph, from C++), which replay()
        cannot see: the capture paid off, as a replay through replay() would have said."""
        self._unreplayed, self._trusted = None, True

    def __len__(self) -> int:
        return len(self._graphs)
