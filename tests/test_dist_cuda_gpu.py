"""GPU tier, two or more GPUs: the CUDA backends of all2all, gemm-rs and ag-gemm, generated as submissions and judged
by the evaluator over NCCL on every official test and benchmark case (world_size replaced by the GPUs present),
then in leaderboard mode (new inputs every call, each output checked: calls back to back must not race through
the reused buffers); all2all also on a single token (its pairs all on one rank) and every token on every rank."""
import os

import pytest

from kbench import evaluator, generator, problems

PROBLEMS = ("all2all", "gemm-rs", "ag-gemm")


def _ranks():
    import torch

    return min(torch.cuda.device_count(), 8)


def _judge(problem, tmp_path, cases, mode="test", **kw):
    sub = generator.generate(problem, "cuda", out=tmp_path / f"{problem}.py")
    ws = _ranks()
    record = evaluator.run(problem, sub, mode=mode, device="cuda", world_size=ws,
                           cases=[problems.official_case(dict(c, world_size=ws)) for c in cases], **kw)
    failed = [(problems.format_case(c.case), c.status, c.message[:300]) for c in record.cases if c.status != "pass"]
    assert not failed, failed
    return record


@pytest.mark.gpu
@pytest.mark.multigpu(2)
@pytest.mark.parametrize("problem", PROBLEMS)
def test_every_official_case(problem, tmp_path):
    spec = problems.load_spec(problem)
    _judge(problem, tmp_path, list(spec.tests) + list(spec.benchmarks))


@pytest.mark.gpu
@pytest.mark.multigpu(2)
@pytest.mark.parametrize("problem", PROBLEMS)
def test_leaderboard_mode_back_to_back(problem, tmp_path):
    spec = problems.load_spec(problem)
    record = _judge(problem, tmp_path, [spec.benchmarks[0], spec.benchmarks[-1]], mode="leaderboard",
                    protocol={"max_runs": 8, "rel_err_stop": 0.0})
    assert all(c.runs == 8 for c in record.cases)


@pytest.mark.gpu
@pytest.mark.multigpu(2)
def test_all2all_edge_routings(tmp_path):
    ws = _ranks()
    cases = [  # one token (max_num_tokens 2 always draws 1): all of a rank's pairs go to one rank
        {"num_experts": ws, "experts_per_token": 1, "hidden_dim": 256, "max_num_tokens": 2, "seed": 3},
        # every token to every rank (top-ws of ws experts), then the largest official shape with a full max_tokens
        {"num_experts": ws, "experts_per_token": ws, "hidden_dim": 512, "max_num_tokens": 64, "seed": 4},
        {"num_experts": 8 * ws, "experts_per_token": 8, "hidden_dim": 7168, "max_num_tokens": 256, "seed": 5},
    ]
    _judge("all2all", tmp_path, cases, mode="leaderboard", protocol={"max_runs": 5, "rel_err_stop": 0.0})
