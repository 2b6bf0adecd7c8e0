"""The spec loader and case parsing: every spec loads, malformed specs are rejected naming file, case and fault."""
import copy
from pathlib import Path

import pytest
import yaml

from kbench import problems

GOOD = {
    "name": "toy", "leaderboard": "amd-toy", "official_gpu": "MI300X", "ranking": "geometric mean of per-benchmark mean time",
    "world_size": None, "default_backend": "torch",
    "tolerance": {"rtol": 0.02, "atol": 0.001},
    "timeouts": {"test": 180, "benchmark": 180, "leaderboard": 180},
    "protocol": {"timer": "host", "l2_flush": False, "rel_err_stop": 0.001, "leaderboard_cases": "all",
                 "combine_seed": True, "clone_inputs": True, "case_values": "text"},
    "roofline": {"math": "fp8", "flops": "2*m*n*k", "bytes": "m*k + n*k + 2*m*n"},
    "tests": [{"m": 64, "n": 64, "k": 128, "seed": 1}],
    "benchmarks": [{"m": 128, "n": 64, "k": 128, "seed": 2}],
    "smoke": [{"m": 64, "n": 64, "k": 128, "seed": 3}],
}


def _write(tmp_path, raw):
    folder = tmp_path / raw.get("name", "toy")
    folder.mkdir(exist_ok=True)
    path = folder / "spec.yml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_good_spec_loads_into_typed_fields(tmp_path):
    spec = problems.load_spec_file(_write(tmp_path, GOOD))
    assert spec.tolerance.rtol == 0.02 and spec.timeouts.for_mode("leaderboard") == 180
    assert spec.protocol.max_runs == 100 and spec.protocol.budget_s["leaderboard"] == 30
    assert spec.roofline.flops({"m": 2, "n": 3, "k": 4}) == 48
    assert spec.tests[0] == {"m": 64, "n": 64, "k": 128, "seed": 1}
    assert not spec.distributed


@pytest.mark.parametrize("mutate, fragment", [
    (lambda r: r.pop("tolerance"), "missing tolerance"),
    (lambda r: r["protocol"].update(timer="wallclock"), "timer is 'wallclock'"),
    (lambda r: r["protocol"].pop("clone_inputs"), "missing clone_inputs"),
    (lambda r: r["benchmarks"][0].pop("seed"), "benchmarks[0]"),
    (lambda r: r["benchmarks"].append({"m": 1, "n": 1, "seed": 1}), "differ from the first case"),
    (lambda r: r["roofline"].update(flops="2*m*q"), "uses q, not a case key"),
    (lambda r: r["roofline"].update(bytes="__import__('os')"), "may use only numbers"),
    (lambda r: r.update(colour="blue"), "unknown keys colour"),
    (lambda r: r["tests"][0].update(m=[1, 2]), "value of 'm'"),
    (lambda r: r.update(world_size=-2), "world_size"),
    (lambda r: r.update(ranking="best run"), "kbench scores the one way"),
])
def test_malformed_spec_names_file_case_and_fault(tmp_path, mutate, fragment):
    raw = copy.deepcopy(GOOD)
    mutate(raw)
    path = _write(tmp_path, raw)
    with pytest.raises(problems.SpecError) as err:
        problems.load_spec_file(path)
    assert str(path) in str(err.value) and fragment in str(err.value)


def test_every_registered_spec_loads():
    names = problems.list_problems()
    for name in names:
        spec = problems.load_spec(name)
        assert spec.name == name and spec.tests and spec.benchmarks and spec.smoke
        for case in spec.tests + spec.benchmarks + spec.smoke:
            assert spec.roofline.flops(case) > 0 and spec.roofline.bytes(case) > 0


# Byte copies of the published specs (../shared/specs at the project's start), kept in the repository so a fresh
# clone checks against them with nothing beside it.
OFFICIAL_SPECS = Path(__file__).resolve().parent / "fixtures" / "official_specs"


@pytest.mark.parametrize("name", problems.list_problems())
def test_spec_equals_the_official_copy(name):
    """Every number in a spec matches the official copy; case lists are exact copies, key order included."""
    path = OFFICIAL_SPECS / f"{name}.yml"
    assert path.is_file(), f"official spec copy {path} is missing"
    official = yaml.safe_load(path.read_text())
    spec = problems.load_spec(name)
    assert spec.name == official["name"]
    assert spec.leaderboard == official["official_leaderboard"]
    assert spec.official_gpu == official["official_gpu"]
    assert spec.ranking == official["ranking"]
    assert spec.world_size == official.get("official_world_size")  # None: a single-GPU problem
    assert (spec.tolerance.rtol, spec.tolerance.atol) == (official["tolerance"]["rtol"], official["tolerance"]["atol"])
    # The official runner's limits default to 180 s per mode when the task file names none (fp8-mm).
    assert (spec.timeouts.test, spec.timeouts.benchmark, spec.timeouts.leaderboard) == (
        official.get("test_timeout", 180), official.get("benchmark_timeout", 180), official.get("ranked_timeout", 180))
    assert [list(c.items()) for c in spec.tests] == [list(c.items()) for c in official["tests"]]
    assert [list(c.items()) for c in spec.benchmarks] == [list(c.items()) for c in official["benchmarks"]]
    assert spec.smoke, "a problem needs smoke cases for CPU runs"


def test_unknown_problem_lists_known_ones():
    with pytest.raises(problems.UnknownProblem, match="known problems"):
        problems.problem_dir("no-such-problem")


def test_case_text_round_trip_replays_the_string_boolean_quirk():
    case = {"world_size": 8, "m": 64, "has_bias": False, "seed": 3}
    assert problems.format_case(case) == "world_size: 8; m: 64; has_bias: False; seed: 3"
    official = problems.official_case(case)
    assert official["has_bias"] == "False" and bool(official["has_bias"])  # truthy, as on the leaderboard
    assert problems.official_case(case, intended_bools=True)["has_bias"] is False


@pytest.mark.parametrize("line", ["m=3", "m: ; n: 2", "m: 1; m: 2", "", "1x: 3"])
def test_bad_case_strings_are_rejected_with_the_form_to_use(line):
    with pytest.raises(problems.BadCase):
        problems.parse_case(line)


def test_combine_seed_matches_the_official_formula():
    assert problems.combine_seed(5, 7) == 5 + 12 * 13 // 2
