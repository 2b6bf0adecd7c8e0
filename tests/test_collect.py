"""benchmarks/collect.py's log parsers on real logs (trimmed copies from a device session, tests/fixtures/logs)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import collect  # noqa: E402

LOGS = ROOT / "tests" / "fixtures" / "logs"
CASE_4096 = "batchsize: 128; dim: 7168; dq: 1536; prefill: 4096; seed: 9817"
CASE_6144 = "batchsize: 128; dim: 7168; dq: 1536; prefill: 6144; seed: 5291"


def test_profile_rows_take_each_cases_kernel_time():
    rows = collect.profile_rows((LOGS / "profile_mla-decode.log").read_text(), "H100", "cuda",
                                {"attention[in-step]": "attention_s_once", "w_uv": r"head_gemm_kernel<true"})
    got = {(r.backend, r.case): r.us for r in rows}
    assert got == {("cuda/attention[in-step]", CASE_4096): 256.294, ("cuda/w_uv", CASE_4096): 14.08,
                   ("cuda/attention[in-step]", CASE_6144): 368.455, ("cuda/w_uv", CASE_6144): 13.952}
    assert {r.metric for r in rows} == {"profiler"}


def test_ncu_rows_follow_the_launch_order_of_the_cases():
    rows = collect.ncu_rows((LOGS / "ncu_mla-decode.log").read_text(), "H100", "cuda", {"attention": "s_once"})
    assert [(r.backend, r.metric, r.case, r.us) for r in rows] == [
        ("cuda/attention", "ncu", CASE_4096, 259.10), ("cuda/attention", "ncu", CASE_6144, 371.94)]


def test_ncu_rows_name_a_kernels_successive_launches_in_a_case():
    # moe at 2048 tokens, clocks free: the shared expert's GEMM 1 and the routed one are the same kernel
    rows = collect.ncu_rows((LOGS / "ncu_moe.log").read_text(), "H100", "cuda",
                            {"gather,gemm1": r"grouped_gemm_kernel<1", "gemm2": r"grouped_gemm_kernel<0"})
    case = ("dhidden: 7168; dexpert: 2048; nroutedexperts: 32; nsharedexperts: 1; nexpertspertoken: 4; bs: 1; "
            "seqlen: 2048; seed: 9371")
    assert [(r.backend, r.case, r.us) for r in rows] == [
        ("cuda/gather", case, 210.08), ("cuda/gemm1", case, 891.87), ("cuda/gemm2", case, 575.97)]


def test_a_time_without_a_unit_is_refused():
    with pytest.raises(ValueError, match="not a time"):
        collect._us("256.3")


def test_a_records_rows_hold_its_means_and_where_kept_its_medians():
    from kbench import benchlib

    case = lambda seed: {"m": 64, "n": 128, "k": 256, "seed": seed}  # noqa: E731
    record = {"problem": "fp8-mm", "mode": "benchmark", "device": "cuda", "world_size": None, "score_s": 2e-6,
              "environment": {"gpu": "NVIDIA H200"},
              "cases": [{"case": case(1), "status": "pass", "mean_ns": 1e3, "median_ns": 900.0},
                        {"case": case(2), "status": "pass", "mean_ns": 4e3, "median_ns": 3600.0}]}
    got = {(r.metric, r.case): r.us for r in benchlib.rows_from_record(record, "cuda")}
    assert got == {("official", "m: 64; n: 128; k: 256; seed: 1"): 1.0, ("official", "m: 64; n: 128; k: 256; seed: 2"): 4.0,
                   ("official", "geomean"): 2.0,
                   ("official-median", "m: 64; n: 128; k: 256; seed: 1"): 0.9,
                   ("official-median", "m: 64; n: 128; k: 256; seed: 2"): 3.6,
                   ("official-median", "geomean"): pytest.approx(1.8)}
    record["environment"]["import_s"] = 27.5
    assert [(r.metric, r.case, r.us) for r in benchlib.rows_from_record(record, "cuda") if r.metric == "import"] == [
        ("import", benchlib.IMPORT_CASE, 27.5)]
    record["environment"]["import_s"] = 0.000616152  # a cached import: kept in the CSV, not rounded to 0.00
    imported = [r for r in benchlib.rows_from_record(record, "cuda") if r.metric == "import"]
    assert imported[0].values()[-1] == "0.000616"
    assert [r.values()[-1] for r in benchlib.rows_from_record(record, "cuda")][:3] == ["1.00", "4.00", "2.00"]
    del record["environment"]["import_s"]
    for c in record["cases"]:  # a record from before medians were kept: the means only
        del c["median_ns"]
    assert {r.metric for r in benchlib.rows_from_record(record, "cuda")} == {"official"}


def test_a_rounds_record_gives_every_rounds_score_and_the_against_files_under_its_name():
    from kbench import benchlib

    record = {"problem": "fp8-mm", "mode": "benchmark", "device": "cuda", "world_size": None, "score_s": 3e-6,
              "environment": {"gpu": "NVIDIA H100"},
              "cases": [{"case": {"m": 64, "n": 128, "k": 256, "seed": 1}, "status": "pass", "mean_ns": 3e3}],
              "rounds": [{"file": "submission", "score_s": 2e-6, "passed": True},
                         {"file": "against", "score_s": 9e-6, "passed": True},
                         {"file": "against", "score_s": 8e-6, "passed": True},
                         {"file": "submission", "score_s": 3e-6, "passed": True}]}
    scores = lambda rows: [(r.backend, r.us) for r in rows if r.case == "geomean"]  # noqa: E731
    assert scores(benchlib.rows_from_record(record, "cuda", against="torch")) == [
        ("cuda", 2.0), ("torch", 9.0), ("torch", 8.0), ("cuda", 3.0)]
    assert scores(benchlib.rows_from_record(record, "cuda")) == [("cuda", 2.0), ("cuda", 3.0)]
    record["rounds"][2]["passed"] = False  # a failed round's score is no figure
    assert ("torch", 8.0) not in scores(benchlib.rows_from_record(record, "cuda", against="torch"))
