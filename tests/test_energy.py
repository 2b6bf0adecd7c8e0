"""benchmarks/energy.py: joules a call from two readings of NVML's energy counter, the candidates' knobs parsed or
refused with the fix, and the results tables labelling the energy metric's unit."""
import pytest

from kbench import benchlib
from load_file import load_file


def _energy():
    return load_file("benchmarks/energy.py", "energy")


def test_per_call_divides_the_counter_and_the_clock_by_the_calls():
    mj, us, watts = _energy().per_call(1_000_000, 1_021_000, 10.0, 13.0, 1800)
    assert mj == pytest.approx(21000 / 1800)  # 11.7 mJ a call
    assert us == pytest.approx(3e6 / 1800)
    assert watts == pytest.approx(7.0)       # 21 J over 3 s
    with pytest.raises(ValueError):
        _energy().per_call(0, 10, 1.0, 1.0, 5)


def test_a_candidate_is_a_name_and_its_knobs():
    parse = _energy().parse_candidate
    assert parse("no-skip=KBENCH_MOE_SKIP_EMPTY_HALVES=0") == ("no-skip", {"KBENCH_MOE_SKIP_EMPTY_HALVES": "0"})
    assert parse("two=A=1,B=2") == ("two", {"A": "1", "B": "2"})
    for bad in ("no-skip", "=A=1", "x=A", "x=A=1,B"):
        with pytest.raises(SystemExit, match="NAME=KNOB=VALUE"):
            parse(bad)


def test_the_energy_tables_say_their_unit(tmp_path):
    case = "seqlen: 2048; seed: 1"
    benchlib.record("moe", [benchlib.Row("H100", 1, "cuda", "energy", case, 1150.0, "2026-01-01"),
                            benchlib.Row("H100", 1, "cuda", "official", case, 1650.0, "2026-01-01")], tmp_path)
    text = benchlib.results_markdown(tmp_path)
    assert "energy · H100 · world size 1 · 2026-01-01 (mJ a call)" in text
    assert "official · H100 · world size 1 · 2026-01-01 (µs)" in text


def test_a_problem_whose_calls_change_their_inputs_is_refused_with_the_reason(monkeypatch):
    """mla-decode's submission appends a row to the cache it is given: thousands of calls on one input set would run
    past the cache, so energy.py says why it will not measure it (before it looks for NVML or a GPU)."""
    energy = _energy()
    monkeypatch.setattr("sys.argv", ["energy.py", "mla-decode"])
    with pytest.raises(SystemExit, match="change their inputs"):
        energy.main()
    monkeypatch.setattr("sys.argv", ["energy.py", "all2all"])
    with pytest.raises(SystemExit, match="distributed"):
        energy.main()
