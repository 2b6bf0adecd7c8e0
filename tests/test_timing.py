"""CPU tier: the official timing windows (evaluator/timing.py) and the official clone (evaluator/guards.py), the
pieces whose difference from the official harness once made kbench read all2all 1.31x slow at world size 2."""
from dataclasses import dataclass

import torch

from kbench.evaluator import guards, timing


def _recording_clock(log: list, with_events: bool = False) -> timing.Clock:
    ticks = iter(range(0, 10_000, 100))

    def now():
        log.append("clock")
        return next(ticks)

    kw = {}
    if with_events:
        kw = dict(new_event=lambda: object(), record=lambda e: log.append("event"),
                  elapsed_ms=lambda a, b: 0.25)
    return timing.Clock(sync=lambda: log.append("sync"), now_ns=now, barrier=lambda: log.append("barrier"),
                        flush=lambda: log.append("flush"), **kw)


def test_the_multi_rank_window_is_the_official_sequence():
    log = []
    ns, out = timing.ranks_window(_recording_clock(log), lambda: log.append("call") or "out")
    # flush outside; synchronize and barrier before rank 0's clock; call; synchronize and barrier before the clock
    assert log == ["flush", "sync", "barrier", "clock", "call", "sync", "barrier", "clock"]
    assert (ns, out) == (100.0, "out")


def test_one_rank_windows():
    log = []
    ns, _ = timing.host_window(_recording_clock(log), lambda: log.append("call"))
    assert log == ["sync", "clock", "call", "sync", "clock"] and ns == 100.0   # the host timer does not flush
    log.clear()
    ns, _ = timing.cuda_event_window(_recording_clock(log, with_events=True), lambda: log.append("call"))
    assert log == ["flush", "event", "call", "event", "sync"] and ns == 0.25e6
    assert timing.timer_for("host", 2, True) is timing.ranks_window
    assert timing.timer_for("cuda_event", 1, True) is timing.cuda_event_window
    assert timing.timer_for("cuda_event", 1, False) is timing.host_window


@dataclass
class RankData:  # stands in for all2all's per-rank inputs: an object the official clone does not copy
    x: torch.Tensor


def test_the_official_clone_copies_tensors_in_containers_and_passes_other_objects_through(monkeypatch):
    monkeypatch.setattr(guards, "torch", torch)  # the harness sets it when a worker starts
    t = torch.arange(6.0).reshape(2, 3).t()                      # a strided view keeps its strides
    rank_data = RankData(torch.ones(3))
    data = (t, [t, {"k": t}], rank_data, 7, None)
    given = guards.clone(data)
    assert isinstance(given, tuple) and isinstance(given[1], list) and isinstance(given[1][1], dict)
    for c in (given[0], given[1][0], given[1][1]["k"]):
        assert c.data_ptr() != t.data_ptr() and torch.equal(c, t) and c.stride() == t.stride()
    assert given[2] is rank_data and given[3] == 7 and given[4] is None    # passed through, as the official clone does
    deep = guards.clone(data, deep=True)                          # the checker's independent copy
    assert deep[2] is not rank_data and deep[2].x.data_ptr() != rank_data.x.data_ptr()
    assert torch.equal(deep[2].x, rank_data.x)


def test_several_ranks_clone_inside_the_timed_window_and_check_after_it(monkeypatch):
    """harness.timed_loop with two ranks: each timed call's clone runs between the clocks (the official window),
    the check and the error-flag reduce come after it."""
    from types import SimpleNamespace

    from kbench.evaluator import harness

    log = []
    monkeypatch.setattr(harness, "clone", lambda obj, deep=False: log.append("deep copy" if deep else "clone") or obj)
    rank = SimpleNamespace(multi=True, world_size=2, cuda=False, clock=lambda flush: _recording_clock(log),
                           any_true=lambda flag: log.append("reduce") or flag, from_rank0=lambda flag: flag)
    protocol = SimpleNamespace(timer="host", clone_inputs=True, max_runs=2, reseed_step=13, rel_err_stop=0.0,
                               budget=1.0, max_wall_s=60, min_runs=2)
    judge = SimpleNamespace(r=rank, p=protocol, clear_l2=None, check_once=lambda case: ("data", None),
                            generate=lambda case: log.append("generate") or "data",
                            call=lambda given: log.append("call") or "out",
                            verify=lambda check, given, out, case: log.append("verify"))
    err, durations = harness.timed_loop(judge, {"seed": 1}, budget_s=10.0, recheck=True)
    assert err is None and len(durations) == 2
    one_run = log[1:log.index("reduce", 1) + 1]   # after check_once's reduce, one leaderboard run
    # the check uses the untouched original (the submission got a clone), so no second copy is taken
    assert one_run == ["generate", "flush", "sync", "barrier", "clock", "clone", "call", "sync", "barrier",
                       "clock", "verify", "reduce"]
