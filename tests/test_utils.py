"""The staged utils.py: the official verbose comparison and device choice."""
import torch

from kbench.problems import utils


def test_verbose_allclose_reports_count_indices_and_values():
    exp = torch.randn(4, 5)
    got = exp.clone()
    got[1, 2] += 1.0
    got[3, 4] = float("nan")
    lines = utils.verbose_allclose(got, exp, rtol=1e-2, atol=1e-3)
    assert lines[0].startswith("Number of mismatched elements: 2")
    assert "(1, 2)" in lines[1] and "(3, 4)" in lines[2]


def test_matching_specials_pass_and_mismatched_specials_fail():
    exp = torch.tensor([1.0, float("inf"), float("nan"), -float("inf")])
    assert utils.verbose_allclose(exp.clone(), exp) == []
    got = exp.clone()
    got[1] = -float("inf")
    assert utils.verbose_allclose(got, exp)


def test_shape_dtype_and_device_problems_are_named():
    exp = torch.randn(3, 3, dtype=torch.bfloat16)
    assert "SIZE MISMATCH" in utils.verbose_allclose(torch.randn(3, 4), exp)[0]
    ok, msg = utils.check_outputs(exp.float(), exp, 1e-2, 1e-2)
    assert not ok and "dtype" in msg
    ok, msg = utils.check_outputs(exp.clone(), exp, 1e-2, 1e-2)
    assert ok and msg == ""


def test_get_device_follows_kbench_device(monkeypatch):
    monkeypatch.setenv("KBENCH_DEVICE", "cpu")
    assert utils.get_device(3) == torch.device("cpu")
