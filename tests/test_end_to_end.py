"""Every problem, end to end on the CPU: `kbench perf PROBLEM` generates the torch backend, runs the spec's smoke cases
(several ranks over gloo for the distributed problems) with the official benchmark loop, and passes."""
import json

import pytest
from click.testing import CliRunner

from kbench import cli
from kbench import problems


@pytest.mark.parametrize("problem", problems.list_problems())
def test_perf_passes_every_problem_on_cpu_smoke_cases(problem, tmp_path):
    out = tmp_path / "run.json"
    result = CliRunner().invoke(cli.main, ["perf", problem, "--device", "cpu", "--json", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    record = json.loads(out.read_text())
    assert record["device"] == "cpu" and record["passed"] and record["score_s"] > 0
    smoke = problems.load_spec(problem).smoke
    assert len(record["cases"]) == len(smoke) and all(c["runs"] >= 3 for c in record["cases"])
