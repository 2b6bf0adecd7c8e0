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


def test_the_clock_summary_counts_the_reasons_bits():
    energy = _energy()
    samples = [(1980, 0), (1650, energy.SW_POWER_CAP), (1600, energy.SW_POWER_CAP | 0x1), (1700, energy.HW_SLOWDOWN)]
    mhz, capped, slowed = energy.clock_summary(samples)
    assert mhz == 1675 and capped == 0.5 and slowed == 0.25
    line = energy.table_line("prefill: 4096", "cuda/attention", [(150.0, 250.0, 600.0), (152.0, 254.0, 598.0)],
                             samples)
    assert line[:8] == ["prefill: 4096", "cuda/attention", "151.0", "252.0", "599", "1675", "50%", "25%"]
    assert len(line) == len(energy.TABLE_COLUMNS)
    assert energy.table_line("c", "v", [(1.0, 2.0, 3.0)], [])[5] == "nan"  # no sample: said, not invented


def test_the_rows_hold_millijoules_and_the_loops_microseconds():
    rows = _energy().result_rows("H100", "cuda/attention", "prefill: 4096", [(150.0, 250.0, 600.0),
                                                                             (152.0, 254.0, 598.0)])
    assert [(r.backend, r.metric, r.us) for r in rows] == [("cuda/attention", "energy", 151.0),
                                                            ("cuda/attention[energy-loop]", "host-loop", 252.0)]


def test_the_variants_take_turns_under_their_knobs_and_give_one_row_pair_each(monkeypatch):
    import os
    energy = _energy()
    order = []

    def fake_measure(call, counter, seconds, batch=1, clocks=None):
        order.append((os.environ.get("KBENCH_X"), batch))
        clocks.append((1500, energy.SW_POWER_CAP))
        return (100.0, 200.0, 500.0)
    monkeypatch.setattr(energy, "measure", fake_measure)
    rows, lines = energy.variant_results(lambda: None, {"cuda": {}, "cuda+x": {"KBENCH_X": "1"}}, None, "H100",
                                         "prefill: 4096; seed: 9", 3.0, rounds=2, batch=8)
    assert order == [(None, 8), ("1", 8), (None, 8), ("1", 8)]
    assert [(r.backend, r.metric) for r in rows] == [("cuda", "energy"), ("cuda[energy-loop]", "host-loop"),
                                                     ("cuda+x", "energy"), ("cuda+x[energy-loop]", "host-loop")]
    assert [line[:2] + line[5:7] for line in lines] == [["prefill: 4096", "cuda", "1500", "100%"],
                                                         ["prefill: 4096", "cuda+x", "1500", "100%"]]
