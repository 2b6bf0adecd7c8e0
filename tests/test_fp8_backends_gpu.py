"""GPU tier: the generated fp8-mm submissions of the cuda and triton backends, judged by the evaluator on every
official test and benchmark case, checked by the problem's reference exactly as `kbench test` does."""
import pytest

from kbench import evaluator
from kbench import generator
from kbench import problems


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_generated_fp8_submission_passes_every_official_case_on_gpu(backend, tmp_path):
    spec = problems.load_spec("fp8-mm")
    submission = generator.generate("fp8-mm", backend, target="h100", out=tmp_path / "submission.py")
    cases = [problems.official_case(c) for c in spec.tests + spec.benchmarks]
    record = evaluator.run("fp8-mm", submission, mode="test", cases=cases, device="cuda")
    failed = [(problems.format_case(c.case), c.status, c.message) for c in record.cases if c.status != "pass"]
    assert not failed and len(record.cases) == len(cases), failed
