"""CPU tier: the named-configuration knobs the CUDA backends share (kernels/_common/knobs.h: env_int,
print_config_once), compiled with the host compiler and run; and how the benchmark scripts time variants beside
the default: candidates under their knobs (benchlib.knobs, checked_candidates) and earlier git revisions
(checked_revisions)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from host_cpp import build_program
from kbench import benchlib

ROOT = Path(__file__).resolve().parent.parent
COMMON = ROOT / "kernels" / "_common"

PROGRAM = r"""
#include <cstdio>
#include "knobs.h"
int main() {
  printf("splits=%d unset=%d junk=%d\n", kb::env_int("KBENCH_T_SPLITS", -1), kb::env_int("KBENCH_T_UNSET", 7),
         kb::env_int("KBENCH_T_JUNK", 5));
  kb::print_config_once("moe_forward T=8: MoeConfig{a=1}");
  kb::print_config_once("moe_forward T=8: MoeConfig{a=1}");
  kb::print_config_once("moe_forward T=9: MoeConfig{a=1}");
  return 0;
}
"""


def _compile_and_run(tmp_path, source: str, include: Path = COMMON, **env_knobs) -> subprocess.CompletedProcess:
    """Build a C++ program against kernels/_common (and ``include``) and run it with only the given KBENCH_*
    variables set (skips the test where the machine has no host compiler)."""
    exe = build_program(tmp_path, source, COMMON, include)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBENCH_")}
    env.update(env_knobs)
    return subprocess.run([str(exe)], env=env, capture_output=True, text=True, check=True)


@pytest.mark.parametrize("printing", [True, False])
def test_knobs_header(tmp_path, printing):
    run = _compile_and_run(tmp_path, PROGRAM, KBENCH_T_SPLITS="3", KBENCH_T_JUNK="2x",
                           KBENCH_PRINT_CONFIG="1" if printing else "0")
    assert run.stdout == "splits=3 unset=7 junk=5\n"
    expected = "moe_forward T=8: MoeConfig{a=1}\nmoe_forward T=9: MoeConfig{a=1}\n" if printing else ""
    assert run.stderr == expected  # each configuration once, and nothing unless asked


LAZY_PROGRAM = r"""
#include <cstdio>
#include "knobs.h"
int main() {
  int formatted = 0;
  for (int i = 0; i < 3; ++i)
    kb::print_config_once([&](char* buf, int size) { ++formatted; snprintf(buf, size, "fp8_gemm 64x64x%d: cfg", i % 2); });
  printf("formatted=%d\n", formatted);
  return 0;
}
"""


@pytest.mark.parametrize("printing", [True, False])
def test_config_lines_are_formatted_only_when_printing(tmp_path, printing):
    """A backend's hot path pays one branch when KBENCH_PRINT_CONFIG is off: the line is not even formatted."""
    run = _compile_and_run(tmp_path, LAZY_PROGRAM, KBENCH_PRINT_CONFIG="1" if printing else "0")
    assert run.stdout == ("formatted=3\n" if printing else "formatted=0\n")
    assert run.stderr == ("fp8_gemm 64x64x0: cfg\nfp8_gemm 64x64x1: cfg\n" if printing else "")


MEMO_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "knobs.h"
int main() {
  kb::KnobsMemo memo("KBENCH_T_");
  auto look = [&] { printf("%d", memo.changed() ? 1 : 0); };
  look();                               // first look: 1
  look();                               // nothing changed: 0
  setenv("KBENCH_T_A", "1", 1); look(); // appeared: 1
  look();                               // 0
  setenv("KBENCH_T_A", "2", 1); look(); // changed: 1
  setenv("KBENCH_T_A", "2", 1); look(); // same value again: 0
  setenv("OTHER_T", "x", 1); look();    // another prefix: 0
  setenv("KBENCH_T", "x", 1); look();   // not the prefix (no trailing underscore): 0
  unsetenv("KBENCH_T_A"); look();       // went: 1
  unsetenv("KBENCH_T_B"); look();       // the one the process started with, gone: 1
  unsetenv("KBENCH_T_C"); look();       // never set: 0
  setenv("KBENCH_T_KNOB_MEMO", "0", 1); look(); look();  // the memo off: every look says changed: 1 1
  unsetenv("KBENCH_T_KNOB_MEMO"); look(); look();        // on again: 1 (it went), then 0
  return 0;
}
"""


def test_knobs_memo_sees_exactly_its_prefix_change(tmp_path):
    """The replay paths read their knobs again only when KnobsMemo says a variable of their prefix changed: every
    change of one must say so, and nothing else may (a missed change would keep a graph captured under the old
    knobs; a false alarm costs only the reads); PREFIXKNOB_MEMO=0 turns it off (every look says changed)."""
    run = _compile_and_run(tmp_path, MEMO_PROGRAM, KBENCH_T_B="0")
    assert run.stdout == "101010001101110"


MLA_CONFIG_PROGRAM = r"""
#include <cstdio>
#include "mla_config.h"
int main() {
  const int shapes[][3] = {{128, 4097, 132}, {128, 6145, 132}, {64, 4097, 132}, {100, 4097, 132}, {8, 1000, 132},
                           {1, 4097, 132}, {1, 65, 132}};
  for (const auto& s : shapes) printf("%d ", mla_config(s[0], s[1], s[2]).splits);
  return 0;
}
"""
MLA_ROPE_FIRST_PROGRAM = r"""
#include <cstdio>
#include "mla_config.h"
int main() {
  const MlaConfig c = mla_config(128, 4097, 132);
  printf("%d", c.rope_first ? 1 : 0);
  return 0;
}
"""


MLA_PERSISTENT_PROGRAM = r"""
#include <cstdio>
#include "mla_config.h"
int main() {
  // (batch, cache rows, SMs): the official batch 128 (256 items on 132 SMs), one item an SM (66), one under (65), a
  // split batch (8: no persistent kernel with splits), batch 100 on a GPU of 64 SMs
  const int shapes[][3] = {{128, 4097, 132}, {128, 6145, 132}, {66, 4097, 132}, {65, 4097, 132}, {8, 1000, 132},
                           {100, 4097, 64}};
  for (const auto& s : shapes) {
    const MlaConfig c = mla_config(s[0], s[1], s[2]);
    printf("%d%d ", c.persistent ? 1 : 0, c.split_release ? 1 : 0);
  }
  return 0;
}
"""


@pytest.mark.parametrize("knobs,expected", [({}, ["11", "11", "00", "00", "00", "11"]),
                                            ({"KBENCH_MLA_PERSISTENT": "0"}, ["00"] * 6),
                                            ({"KBENCH_MLA_PERSISTENT": "1"}, ["11", "11", "11", "11", "00", "11"]),
                                            ({"KBENCH_MLA_SPLIT_RELEASE": "0"}, ["10", "10", "00", "00", "00", "10"]),
                                            ({"KBENCH_MLA_ROPE_FIRST": "0"}, ["10", "10", "00", "00", "00", "10"])])
def test_mla_persistent_where_a_cta_gets_two_or_more_items(tmp_path, knobs, expected):
    """mla-decode's persistent attention kernel: the default where there are more work items (2 a batch row) than
    SMs, off with one item an SM, never with splits; KBENCH_MLA_PERSISTENT=0/1 forces it (splits still win). Its
    stages released in two halves (split_release) wherever it runs with the rope block loaded first, unless
    KBENCH_MLA_SPLIT_RELEASE=0."""
    run = _compile_and_run(tmp_path, MLA_PERSISTENT_PROGRAM, ROOT / "kernels" / "mla-decode" / "cuda", **knobs)
    assert run.stdout.split() == expected


@pytest.mark.parametrize("knobs,expected", [({}, "1"), ({"KBENCH_MLA_ROPE_FIRST": "0"}, "0"),
                                            ({"KBENCH_MLA_ROPE_FIRST": "1"}, "1")])
def test_mla_rope_first_is_on_by_default_and_its_knob_flips_it(tmp_path, knobs, expected):
    run = _compile_and_run(tmp_path, MLA_ROPE_FIRST_PROGRAM, ROOT / "kernels" / "mla-decode" / "cuda", **knobs)
    assert run.stdout == expected


@pytest.mark.parametrize("forced", [None, "2"])
def test_mla_splits_only_where_the_batch_leaves_waves_empty(tmp_path, forced):
    """mla-decode's MlaConfig: one split where 2 CTAs a batch row fill >= 90% of their waves (the official batch 128
    on an H100's 132 SMs), else about two waves of CTAs with >= 4 cache tiles each; KBENCH_MLA_SPLITS forces a
    count (at most the tiles)."""
    knobs = {"KBENCH_MLA_SPLITS": forced} if forced else {}
    run = _compile_and_run(tmp_path, MLA_CONFIG_PROGRAM, ROOT / "kernels" / "mla-decode" / "cuda", **knobs)
    assert run.stdout.split() == (["2"] * 7 if forced else ["1", "1", "1", "2", "4", "16", "1"])


MOE_RULES_PROGRAM = r"""
#include <cstdio>
#include "moe_rules.h"
int main() {
  // (tokens, slots, routed experts): the official cases, the 512-row boundary, the tests' E = 8 and E = 4 routings
  const int shapes[][3] = {{2048, 4, 32}, {8192, 4, 32}, {4096, 4, 32}, {4097, 4, 32}, {1000, 4, 8}, {4096, 1, 4}};
  for (const auto& s : shapes) printf("%d ", moe_skip_empty_halves(s[0], s[1], s[2]) ? 1 : 0);
  return 0;
}
"""


@pytest.mark.parametrize("knobs,expected", [({}, ["1", "0", "1", "0", "1", "0"]),
                                            ({"KBENCH_MOE_SKIP_EMPTY_HALVES": "0"}, ["0"] * 6),
                                            ({"KBENCH_MOE_SKIP_EMPTY_HALVES": "1"}, ["1"] * 6)])
def test_moe_skips_empty_halves_where_experts_average_at_most_512_rows(tmp_path, knobs, expected):
    """moe's skip_empty_halves: on by default for the 2048-token case (256 rows an expert), off for 8192 (1024), the
    boundary at 512 rows an expert; KBENCH_MOE_SKIP_EMPTY_HALVES=0/1 forces it."""
    run = _compile_and_run(tmp_path, MOE_RULES_PROGRAM, ROOT / "kernels" / "moe" / "cuda", **knobs)
    assert run.stdout.split() == expected


LINEAR_CONFIG_PROGRAM = r"""
#include <cstdio>
#include "linear_config.h"
int main() {
  // the step's projections at batch 128 (n, k): wo, q_up, q_down, kv_down; then a k no tile divides
  const int shapes[][2] = {{7168, 16384}, {24576, 1536}, {1536, 7168}, {576, 7168}, {512, 100}};
  // an H100 holding 132 CTAs of any configuration, then one that holds only 8 clusters of more than one CTA
  for (const int cap : {132, 8}) {
    for (const auto& s : shapes) {
      const LinearConfig c = linear_config(s[0], s[1], 132, [&](int, int splits) {
        const int whole = 132 / splits;  // one CTA an SM, whole clusters
        return (splits > 1 && cap < whole ? cap : whole) * splits;
      });
      printf("%d/%d ", c.bn, c.splits);
    }
  }
  return 0;
}
"""


@pytest.mark.parametrize("knobs,expected", [
    ({"KBENCH_MLA_LINEAR": "0"}, ["0/0"] * 10),
    ({}, ["56/1", "192/1", "96/8", "56/8", "0/0", "56/1", "192/1", "192/8", "96/8", "0/0"]),
    ({"KBENCH_MLA_LINEAR_BN": "256"}, ["256/4", "256/1", "256/8", "256/8", "0/0",
                                       "256/1", "256/1", "256/8", "256/8", "0/0"])])
def test_linear_tiles_fill_one_wave_of_the_sms(tmp_path, knobs, expected):
    """mla-decode's LinearConfig: on unless KBENCH_MLA_LINEAR=0; the n-tile and k-split whose one wave of CTAs
    streams W closest to evenly over the 132 SMs (wo: 128 tiles of 56, no split; q_up: 128 tiles of 192), fewer
    splits on a tie, never more CTAs than the GPU holds in whole clusters, nothing for a k that is not a multiple of
    64."""
    run = _compile_and_run(tmp_path, LINEAR_CONFIG_PROGRAM, ROOT / "kernels" / "mla-decode" / "cuda", **knobs)
    assert run.stdout.split() == expected


def test_benchlib_knobs_set_and_restore(monkeypatch):
    monkeypatch.setenv("KBENCH_T_KEEP", "old")
    monkeypatch.delenv("KBENCH_T_NEW", raising=False)
    with benchlib.knobs({"KBENCH_T_KEEP": "1", "KBENCH_T_NEW": "2"}):
        assert os.environ["KBENCH_T_KEEP"] == "1" and os.environ["KBENCH_T_NEW"] == "2"
    assert os.environ["KBENCH_T_KEEP"] == "old" and "KBENCH_T_NEW" not in os.environ
    with pytest.raises(RuntimeError):
        with benchlib.knobs({"KBENCH_T_NEW": "3"}):
            raise RuntimeError("a failing candidate")
    assert "KBENCH_T_NEW" not in os.environ


def test_interleaved_variants_share_a_drift_and_run_under_their_knobs():
    """benchlib.interleaved: on a timer that reads 1 us more every sample (a GPU heating up), two variants doing the
    same work get the same median, where timing one after the other would put the second 8 us behind; each variant's
    calls see its own knobs, and the environment is restored."""
    calls = []

    class DriftingTimer:
        now = 0.0

        def samples(self, fn, runs, warmup):
            out = []
            for _ in range(runs):
                fn()
                DriftingTimer.now += 1.0
                out.append(DriftingTimer.now)
            return out

    variants = {"a": (lambda: calls.append(("a", os.environ.get("KBENCH_TEST_T"))), {}),
                "b": (lambda: calls.append(("b", os.environ.get("KBENCH_TEST_T"))), {"KBENCH_TEST_T": "1"})}
    got = benchlib.interleaved(DriftingTimer(), variants, runs=8, rounds=4)
    assert got["a"] == got["b"] == 12.5  # (after the settling pass's four samples)
    assert {knob for name, knob in calls if name == "a"} == {None}
    assert {knob for name, knob in calls if name == "b"} == {"1"}
    assert "KBENCH_TEST_T" not in os.environ


def test_candidates_are_checked_under_their_knobs():
    seen = []

    def check():
        seen.append(os.environ.get("KBENCH_T_FAST"))
        return ["case 1: mismatch"] if os.environ.get("KBENCH_T_FAST") == "2" else []

    cands = {"fast": {"KBENCH_T_FAST": "1"}, "wrong": {"KBENCH_T_FAST": "2"}}
    passed, failures = benchlib.checked_candidates(cands, "fast,wrong", check)
    assert passed == ["fast"] and failures == ["cuda+wrong: case 1: mismatch"] and seen == ["1", "2"]
    assert benchlib.checked_candidates(cands, "", check) == ([], [])
    with pytest.raises(SystemExit, match="unknown candidate 'slow'"):
        benchlib.checked_candidates(cands, "slow", check)


def test_a_backend_as_it_was_at_a_git_revision_builds_and_runs():
    """benchmarks' --rev: kernels/ of a revision, extracted and built beside the current one (CPU: the torch backend)."""
    from kbench import problems

    if shutil.which("git") is None or not (Path(__file__).resolve().parent.parent / ".git").exists():
        pytest.skip("needs the git checkout")
    ref = problems.load_modules("fp8-mm").reference
    data = ref.generate_input(**problems.official_case(problems.load_spec("fp8-mm").smoke[0]))
    mods, failures = benchlib.checked_revisions(
        "fp8-mm", "torch", ["HEAD"], lambda mod: [] if ref.check_implementation(data, mod.custom_kernel(data))[0]
        else ["mismatch"])
    assert list(mods) == ["torch@HEAD"] and failures == []
    assert (benchlib.kernels_at("HEAD") / "fp8-mm" / "torch" / "kernel.yml").is_file()
    with pytest.raises(ValueError, match="revision 'no-such-revision'"):
        benchlib.build("fp8-mm", "torch", rev="no-such-revision")


def test_a_carried_kernels_folder_stands_for_a_revision(tmp_path):
    """--rev FOLDER: a folder holding kernels/ (old kernels carried where the checkout lacks the revision)."""
    shutil.copytree(Path(benchlib.__file__).resolve().parent / "kernels" / "fp8-mm",
                    tmp_path / "kernels" / "fp8-mm")
    assert benchlib.kernels_at(str(tmp_path)) == tmp_path / "kernels"
    mod = benchlib.build("fp8-mm", "torch", rev=str(tmp_path))
    assert callable(mod.custom_kernel)


@pytest.mark.parametrize("problem,config_sources,key_tuple,prefix", [
    ("mla-decode", ("mla_config.h", "linear_config.h", "binding.cpp"), "_CONFIG_KNOBS", "KBENCH_MLA_"),
    ("moe", ("moe.cu", "moe_rules.h"), "_KNOBS", "KBENCH_MOE_")])
def test_every_config_knob_keys_the_captured_graph(problem, config_sources, key_tuple, prefix):
    """A knob the backend's config reads but the graph key leaves out would replay the configuration captured first:
    a candidate timed through the whole call would silently run the default (it did, for KBENCH_MLA_SEESAW)."""
    backend = ROOT / "kernels" / problem / "cuda"
    read = {knob for source in config_sources
            for knob in re.findall(rf'env_int\("({prefix}\w+)"', (backend / source).read_text())}
    keyed = re.search(rf"{key_tuple} = \(([^)]*)\)", (backend / "entry.py").read_text())
    assert read and keyed
    assert read == set(re.findall(rf'"({prefix}\w+)"', keyed.group(1)))


@pytest.mark.parametrize("settle", [True, False])
def test_a_fast_start_is_settled_before_the_rounds(settle):
    """benchlib.interleaved_samples: a GPU whose first samples read fast (its clock high after a pause) favours the
    variant that runs first; the settling pass takes those samples, so identical variants read alike."""
    taken = []

    def sample(fn, n, warmup):
        out = [0.0 if len(taken) + i < 2 else 10.0 for i in range(n)]
        taken.extend(out)
        return out

    variants = {"a": (lambda: None, {}), "b": (lambda: None, {})}
    got = benchlib.interleaved_samples(sample, variants, runs=4, rounds=2, settle=settle)
    medians = {name: benchlib.median(v) for name, v in got.items()}
    assert medians == ({"a": 10.0, "b": 10.0} if settle else {"a": 5.0, "b": 10.0})
