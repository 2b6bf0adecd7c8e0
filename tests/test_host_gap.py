"""benchmarks/host_gap.py --leaderboard replays leaderboard mode's inputs: every run reseeded by the protocol's step,
generated while the previous run's inputs are still held (so they land at new addresses), cloned where the protocol
clones."""
import weakref

import torch

from kbench import problems
from load_file import load_file


def _host_gap():
    return load_file("benchmarks/host_gap.py", "host_gap")


class _Reference:
    """generate_input records each seed and whether the previous inputs were alive while it ran."""

    def __init__(self):
        self.seeds, self.previous_alive, self._last = [], [], None

    def generate_input(self, seed, **case):
        self.seeds.append(seed)
        self.previous_alive.append(self._last is not None and self._last() is not None)
        data = (torch.randn(4, 8), {"w": torch.randn(8, 8)}, dict(case))
        self._last = weakref.ref(data[0])
        return data


def test_leaderboard_inputs_are_reseeded_and_generated_beside_the_previous_ones():
    case = problems.load_spec("moe").benchmarks[0]
    seed = problems.official_case(case)["seed"]
    ref = _Reference()
    first = ref.generate_input(**problems.official_case(case))
    given_for_run = _host_gap().reseeded_inputs(ref, case, first, clone_inputs=True, step=13)
    runs = []
    for _ in range(3):
        given = given_for_run()
        runs.append(given)
        del given
    assert ref.seeds[1:] == [seed + 13, seed + 26, seed + 39]
    assert all(ref.previous_alive[1:]), "each run's inputs must be generated while the previous run's are held"
    generated = ref._last()  # the last run's x as generated: the run got a clone of it (the protocol clones)
    assert torch.equal(runs[-1][0], generated) and runs[-1][0].data_ptr() != generated.data_ptr()


def test_host_trace_counts_only_the_windows_top_level_ops(monkeypatch):
    """--host-trace: the host events inside the official window, per top-level op (its callees not counted again),
    nothing from outside it (the inputs' generation), and the last window's timeline in order."""
    host_gap = _host_gap()
    monkeypatch.setattr(host_gap, "timed_runs", lambda call, given, runs: [call(given()) for _ in range(runs)])
    a = torch.randn(64, 64)

    def given():
        return torch.randn(64, 64) + 1  # outside the window: aten::randn and aten::add must not appear

    def call(b):
        return torch.mm(a, b).relu()

    rows, timeline = host_gap.host_events(call, given, 3)
    names = {(kind, name): float(calls) for kind, name, calls, _, _ in rows}
    assert names[("op", "aten::mm")] == 1.0 and names[("op", "aten::relu")] == 1.0
    assert ("op", "aten::clamp_min") not in names, "relu's callee counted as a top-level op"
    assert not any(name in ("aten::randn", "aten::add") for _, name in names), "generation counted in the window"
    starts = [float(r[2]) for r in timeline]
    assert [r[1] for r in timeline][:2] == ["aten::mm", "aten::relu"] and starts == sorted(starts)


def test_check_each_checks_every_run_against_an_untouched_copy():
    """--check-each where the submission gets the originals (mla-decode): each run's output is checked against a
    deep copy made before the call, so what the call writes into its inputs cannot pass its own check."""
    case = problems.load_spec("mla-decode").benchmarks[0]
    ref = _Reference()
    checked = []

    def check_implementation(data, output):
        checked.append((data[0].clone(), output))
        return True, ""
    ref.check_implementation = check_implementation
    given_for_run = _host_gap().reseeded_inputs(ref, case, ref.generate_input(**problems.official_case(case)),
                                                clone_inputs=False, step=13, check_each=True)
    for _ in range(2):
        given = given_for_run()
        before = given[0].clone()
        given[0].add_(100.0)  # the call writes into its input (mla-decode appends to its cache)
        given_for_run.check("out")
        assert torch.equal(checked[-1][0], before) and checked[-1][1] == "out"
    assert len(checked) == 2
    assert _host_gap().reseeded_inputs(ref, case, None, clone_inputs=False, step=13).check is None
