"""benchmarks/power_trace.py reads nvidia-smi's samples: busy ones only, the power-cap bit counted, bad lines skipped."""
from load_file import load_file


def _power_trace():
    return load_file("benchmarks/power_trace.py", "power_trace")


def test_the_summary_counts_busy_samples_and_the_power_cap():
    pt = _power_trace()
    lines = ["2026/11/25 22:06:00.06, 100 %, 1080 MHz, 697.16 W, 0x0000000000000004",
             "2026/11/25 22:06:00.14, 100 %, 1230 MHz, 716.38 W, 0x0000000000000005",
             "2026/11/25 22:06:01.14, 99 %, 1330 MHz, 700.00 W, 0x0000000000000000",
             "2026/11/25 22:06:02.14, 0 %, 1980 MHz, 70.00 W, 0x0000000000000001",  # idle: left out
             "[N/A], [N/A], [N/A], [N/A], [N/A]", "garbage"]
    samples = [s for s in map(pt.parse, lines) if s]
    assert len(samples) == 4
    out = pt.summarize(samples)
    assert out[0].startswith("  22:06:00") and "power cap 2/2" in out[0]
    assert "power cap 0/1" in out[1]
    assert "3 busy samples" in out[-1] and "median 1230 MHz (min 1080, max 1330)" in out[-1]
    assert "max 716.4" in out[-1] and "67% of them" in out[-1]


def test_no_busy_samples_is_said():
    pt = _power_trace()
    assert pt.summarize([("22:00:00", 0, 1980, 70.0, 1)]) == ["power trace: no busy samples"]
