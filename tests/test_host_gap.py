"""benchmarks/host_gap.py --leaderboard replays leaderboard mode's inputs: every run reseeded by the protocol's step,
generated while the previous run's inputs are still held (so they land at new addresses), cloned where the protocol
clones."""
import importlib.util
import weakref
from pathlib import Path

import torch

from kbench import problems

ROOT = Path(__file__).resolve().parent.parent


def _host_gap():
    spec = importlib.util.spec_from_file_location("host_gap", ROOT / "benchmarks" / "host_gap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
