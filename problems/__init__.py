"""The judge's side of kbench: the registry of problems and the loader of their specs.

The registry is the folder listing: every folder under problems/ that holds a ``spec.yml`` is a problem. Each spec is
loaded once into the typed dataclasses below; a malformed spec is rejected with a ``SpecError`` naming the file, the
case (when one is at fault) and what is wrong.

Cases are plain dicts in the spec's key order, exactly what the official harness hands to ``generate_input``. The
official harness reads its cases from a text file (``key: value; key: value``), so a value that is not an integer
reaches ``generate_input`` as a string: ``has_bias: False`` arrives as the (truthy) string "False". ``official_case``
replays that round trip; ``intended_bools=True`` gives the intended meaning instead.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import math
import operator
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Mapping

import yaml

PROBLEMS_ROOT = Path(__file__).resolve().parent
UTILS_PATH = PROBLEMS_ROOT / "utils.py"

Case = dict[str, Any]
RANKING = "geometric mean of per-benchmark mean time"     # the only score the six leaderboards used


class SpecError(ValueError):
    """A spec.yml that does not describe a problem the way the loader needs."""


class UnknownProblem(ValueError):
    """A problem name that is not a folder under problems/."""


class BadCase(ValueError):
    """A case string that is not of the official ``key: value; key: value`` form."""


# ----------------------------------------------------------------------------------------------------------------
# registry

def list_problems() -> list[str]:
    """Names of the problems: folders under problems/ holding a spec.yml, sorted."""
    return sorted(p.name for p in PROBLEMS_ROOT.iterdir() if (p / "spec.yml").is_file())


def problem_dir(name: str) -> Path:
    """Folder of a problem; an unknown name raises UnknownProblem listing the known ones."""
    path = PROBLEMS_ROOT / name
    if not (path / "spec.yml").is_file():
        known = ", ".join(list_problems()) or "(none)"
        raise UnknownProblem(f"unknown problem {name!r}; known problems: {known}")
    return path


# ----------------------------------------------------------------------------------------------------------------
# cases: the official text form

_CASE_KEY = re.compile(r"^[A-Za-z_]+$")


def format_case(case: Mapping[str, Any]) -> str:
    """One line of the official case file: ``k: v; k: v``."""
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def _case_value(text: str, intended_bools: bool) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    if intended_bools and text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    return text


def parse_case(line: str, intended_bools: bool = False) -> Case:
    """Parse ``key: value; key: value`` as the official harness does (int if it parses, else the string)."""
    case: Case = {}
    for part in line.strip().split(";"):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if "," in value or "," in key:
            raise BadCase(f"bad case {line.strip()!r}: separate the pairs with ';', not ',' "
                          "(write it as 'key: value; key: value')")
        if not sep or not _CASE_KEY.match(key) or not value:
            raise BadCase(f"bad case {line.strip()!r}: write it as 'key: value; key: value' (e.g. 'm: 64; n: 64; k: 128; seed: 1')")
        if key in case:
            raise BadCase(f"bad case {line.strip()!r}: key {key!r} given twice")
        case[key] = _case_value(value, intended_bools)
    if not case:
        raise BadCase("empty case: write it as 'key: value; key: value'")
    return case


def official_case(case: Mapping[str, Any], intended_bools: bool = False) -> Case:
    """The case as the official harness hands it to generate_input: through its text file and back."""
    return parse_case(format_case(case), intended_bools=intended_bools)


def combine_seed(a: int, b: int) -> int:
    """The official secret-seed combination of a case seed ``a`` with the run seed ``b``."""
    return a + (a + b) * (a + b + 1) // 2


# ----------------------------------------------------------------------------------------------------------------
# roofline expressions: arithmetic over case keys, evaluated without eval()

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor}


class Expression:
    """An arithmetic expression over case keys, e.g. ``2*m*n*k``; names resolve to case values or ``defaults``."""

    def __init__(self, text: str, where: str):
        self.text = str(text)
        try:
            self._tree = ast.parse(self.text, mode="eval").body
        except SyntaxError as exc:
            raise SpecError(f"{where}: cannot parse expression {self.text!r}: {exc.msg}") from None
        self._check(self._tree, where)

    def _check(self, node: ast.AST, where: str) -> None:
        ok = (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Call, ast.USub, ast.UAdd, ast.Load, *_BINOPS)
        for sub in ast.walk(node):
            if not isinstance(sub, ok) or (isinstance(sub, ast.Call) and not (
                    isinstance(sub.func, ast.Name) and sub.func.id in _FUNCS)):
                raise SpecError(f"{where}: {self.text!r} may use only numbers, case keys, + - * / // % ** and "
                                f"{', '.join(_FUNCS)}")

    def names(self) -> set[str]:
        return {n.id for n in ast.walk(self._tree) if isinstance(n, ast.Name) and n.id not in _FUNCS}

    def __call__(self, case: Mapping[str, Any], defaults: Mapping[str, Any] = {}) -> float:
        env = {**defaults, **case}

        def ev(node: ast.AST) -> Any:
            if isinstance(node, ast.Constant):
                return node.value
            if isinstance(node, ast.Name):
                if node.id not in env:
                    raise KeyError(f"roofline expression {self.text!r} needs case key {node.id!r}")
                value = env[node.id]
                return bool_value(value) if isinstance(value, (str, bool)) else value
            if isinstance(node, ast.UnaryOp):
                return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
            if isinstance(node, ast.BinOp):
                return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
            assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            return _FUNCS[node.func.id](*(ev(a) for a in node.args))

        return float(ev(self._tree))


def bool_value(value: Any) -> int:
    """1/0 for a flag written as a bool or as the official strings (roofline arithmetic counts a bias only if set)."""
    if isinstance(value, str):
        return int(value.lower() == "true")
    return int(bool(value))


# ----------------------------------------------------------------------------------------------------------------
# typed spec

@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


@dataclass(frozen=True)
class Timeouts:
    """Per-mode time limits in seconds (the official runner's; compilation counts inside them)."""
    test: float
    benchmark: float
    leaderboard: float

    def for_mode(self, mode: str) -> float:
        return {"test": self.test, "benchmark": self.benchmark, "leaderboard": self.leaderboard,
                "profile": self.benchmark}[mode]


@dataclass(frozen=True)
class Protocol:
    """How the official harness judges this problem (../shared/EVAL_PROTOCOL.md); the evaluator reads only this.

    timer: "host" (synchronize + host clock around the call) or "cuda_event" (events around the call); used for one
    rank. Several ranks always use the official barrier + host clock on rank 0.
    """
    timer: str
    l2_flush: bool
    rel_err_stop: float
    leaderboard_cases: str
    combine_seed: bool
    clone_inputs: bool
    case_values: str = "text"
    max_runs: int = 100
    min_runs: int = 3
    budget_s: Mapping[str, float] = field(default_factory=lambda: {"benchmark": 10.0, "leaderboard": 30.0})
    max_wall_s: float = 120.0
    compile_allowance_s: float = 120.0  # the runner's allowance for building the submission (its import), inside the time limit
    warmup_budget_s: Mapping[str, float] = field(default_factory=lambda: {"benchmark": 0.1, "leaderboard": 0.01})
    reseed_step: int = 13
    # profile mode: calls before the profiled one (0: the official profile mode's single call; kbench profile --warmup
    # N shows a submission's steady state, e.g. its graph replays, instead of its first call's capture)
    profile_warmup: int = 0
    # case keys that must divide by the world size (checked before any worker starts, so --world-size N fails early)
    divisible_by_world_size: tuple[str, ...] = ()


@dataclass(frozen=True)
class Roofline:
    """Speed-of-light inputs: operations and minimal bytes (per rank) as functions of a case."""
    math: str
    flops_expr: Expression
    bytes_expr: Expression
    comm_bytes_expr: Expression | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def flops(self, case: Mapping[str, Any]) -> float:
        return self.flops_expr(case, self.defaults)

    def bytes(self, case: Mapping[str, Any]) -> float:
        return self.bytes_expr(case, self.defaults)

    def comm_bytes(self, case: Mapping[str, Any]) -> float:
        return self.comm_bytes_expr(case, self.defaults) if self.comm_bytes_expr else 0.0


@dataclass(frozen=True)
class Spec:
    name: str
    leaderboard: str
    official_gpu: str
    ranking: str
    tolerance: Tolerance
    timeouts: Timeouts
    world_size: int | None
    default_backend: str
    protocol: Protocol
    roofline: Roofline
    tests: tuple[Case, ...]
    benchmarks: tuple[Case, ...]
    smoke: tuple[Case, ...]
    path: Path

    @property
    def distributed(self) -> bool:
        return self.world_size is not None

    def cases(self, kind: str) -> tuple[Case, ...]:
        """The case list named ``tests``, ``benchmarks`` or ``smoke``."""
        if kind not in ("tests", "benchmarks", "smoke"):
            raise ValueError(f"unknown case list {kind!r}; choose tests, benchmarks or smoke")
        return getattr(self, kind)


_TOP_KEYS = {"name", "leaderboard", "official_gpu", "ranking", "world_size", "default_backend", "tolerance",
             "timeouts", "protocol", "roofline", "tests", "benchmarks", "smoke"}
_PROTOCOL_REQUIRED = ("timer", "l2_flush", "rel_err_stop", "leaderboard_cases", "combine_seed", "clone_inputs")
_CHOICES = {"timer": ("host", "cuda_event"), "leaderboard_cases": ("all", "last"), "case_values": ("text",),
            "math": ("fp8", "bf16", "fp16", "fp32")}


def _require(raw: Mapping[str, Any], keys, where: str) -> None:
    missing = [k for k in keys if k not in raw]
    if missing:
        raise SpecError(f"{where}: missing {', '.join(missing)}")


def _choice(value: Any, key: str, where: str) -> Any:
    if value not in _CHOICES[key]:
        raise SpecError(f"{where}: {key} is {value!r}; expected one of {', '.join(_CHOICES[key])}")
    return value


def _number(value: Any, key: str, where: str, integer: bool = False) -> Any:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
        raise SpecError(f"{where}: {key} must be a non-negative {'integer' if integer else 'number'}, got {value!r}")
    return value


def _cases(raw: Any, key: str, where: str, keys: list[str] | None, world_size: int | None) -> tuple[Case, ...]:
    if not isinstance(raw, list) or (key != "smoke" and not raw):
        raise SpecError(f"{where}: {key} must be a non-empty list of cases")
    out = []
    for i, case in enumerate(raw):
        at = f"{where}: {key}[{i}] {case!r}"
        if not isinstance(case, dict) or not case:
            raise SpecError(f"{at}: a case is a mapping of key: value")
        for k, v in case.items():
            if not isinstance(k, str) or not _CASE_KEY.match(k):
                raise SpecError(f"{at}: key {k!r} must be letters and '_'")
            if not isinstance(v, (int, bool, str)):
                raise SpecError(f"{at}: value of {k!r} must be an integer, a boolean or a word")
        if "seed" not in case:
            raise SpecError(f"{at}: missing seed")
        if keys is not None and key != "smoke" and list(case) != keys:
            raise SpecError(f"{at}: keys {list(case)} differ from the first case's {keys}")
        if keys is not None and key == "smoke" and not set(keys) <= set(case):
            raise SpecError(f"{at}: smoke cases need every official key {keys}")
        if world_size is not None and "world_size" not in case:
            raise SpecError(f"{at}: a distributed problem's case needs world_size")
        out.append(dict(case))
    return tuple(out)


def parse_spec(raw: Any, path: Path) -> Spec:
    """Turn the YAML of one spec.yml into a Spec, or raise SpecError naming the file and what is wrong."""
    where = str(path)
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: expected a mapping at the top level")
    _require(raw, sorted(_TOP_KEYS - {"smoke"}), where)
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise SpecError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    if raw["name"] != path.parent.name:
        raise SpecError(f"{where}: name {raw['name']!r} differs from its folder {path.parent.name!r}")
    if raw["ranking"] != RANKING:
        raise SpecError(f"{where}: ranking {raw['ranking']!r}: kbench scores the one way the leaderboards did, "
                        f"{RANKING!r} (evaluator/record.py score_s)")

    tol = raw["tolerance"]
    _require(tol if isinstance(tol, dict) else {}, ("rtol", "atol"), f"{where}: tolerance")
    tolerance = Tolerance(float(_number(tol["rtol"], "rtol", where)), float(_number(tol["atol"], "atol", where)))

    to = raw["timeouts"]
    _require(to if isinstance(to, dict) else {}, ("test", "benchmark", "leaderboard"), f"{where}: timeouts")
    timeouts = Timeouts(*(float(_number(to[k], k, f"{where}: timeouts")) for k in ("test", "benchmark", "leaderboard")))

    ws = raw["world_size"]
    if ws is not None and (_number(ws, "world_size", where, integer=True) < 1):
        raise SpecError(f"{where}: world_size must be null or >= 1")

    pr = raw["protocol"]
    if not isinstance(pr, dict):
        raise SpecError(f"{where}: protocol must be a mapping")
    _require(pr, _PROTOCOL_REQUIRED, f"{where}: protocol")
    known = set(Protocol.__dataclass_fields__)
    if set(pr) - known:
        raise SpecError(f"{where}: protocol has unknown keys {', '.join(sorted(set(pr) - known))}")
    for key in ("timer", "leaderboard_cases", "case_values"):
        if key in pr:
            _choice(pr[key], key, f"{where}: protocol")
    for key in ("l2_flush", "combine_seed", "clone_inputs"):
        if not isinstance(pr[key], bool):
            raise SpecError(f"{where}: protocol.{key} must be true or false")
    _number(pr["rel_err_stop"], "rel_err_stop", f"{where}: protocol")
    divisible = pr.get("divisible_by_world_size", [])
    if not isinstance(divisible, list) or not all(isinstance(k, str) for k in divisible):
        raise SpecError(f"{where}: protocol.divisible_by_world_size must be a list of case keys")
    protocol = Protocol(**{**pr, "divisible_by_world_size": tuple(divisible)})

    rf = raw["roofline"]
    if not isinstance(rf, dict):
        raise SpecError(f"{where}: roofline must be a mapping")
    _require(rf, ("math", "flops", "bytes"), f"{where}: roofline")
    _choice(rf["math"], "math", f"{where}: roofline")
    roofline = Roofline(
        math=rf["math"],
        flops_expr=Expression(rf["flops"], f"{where}: roofline.flops"),
        bytes_expr=Expression(rf["bytes"], f"{where}: roofline.bytes"),
        comm_bytes_expr=Expression(rf["comm_bytes"], f"{where}: roofline.comm_bytes") if "comm_bytes" in rf else None,
        defaults=dict(rf.get("defaults") or {}),
    )

    tests = _cases(raw["tests"], "tests", where, None, ws)
    keys = list(tests[0])
    tests = _cases(raw["tests"], "tests", where, keys, ws)
    benchmarks = _cases(raw["benchmarks"], "benchmarks", where, keys, ws)
    smoke = _cases(raw.get("smoke") or [], "smoke", where, keys, ws)

    for name, expr in (("flops", roofline.flops_expr), ("bytes", roofline.bytes_expr),
                       ("comm_bytes", roofline.comm_bytes_expr)):
        if expr is None:
            continue
        missing = expr.names() - set(keys) - set(roofline.defaults)
        if missing:
            raise SpecError(f"{where}: roofline.{name} uses {', '.join(sorted(missing))}, not a case key")

    return Spec(name=raw["name"], leaderboard=str(raw["leaderboard"]), official_gpu=str(raw["official_gpu"]),
                ranking=str(raw["ranking"]), tolerance=tolerance, timeouts=timeouts, world_size=ws,
                default_backend=str(raw["default_backend"]), protocol=protocol, roofline=roofline,
                tests=tests, benchmarks=benchmarks, smoke=smoke, path=path)


def load_spec_file(path: str | Path) -> Spec:
    """Load one spec.yml from anywhere (tests use this for malformed specs)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    return parse_spec(raw, path)


@functools.lru_cache(maxsize=None)
def load_spec(name: str) -> Spec:
    """The typed spec of a registered problem (cached)."""
    return load_spec_file(problem_dir(name) / "spec.yml")


# ----------------------------------------------------------------------------------------------------------------
# in-process modules of a problem (tests and tools; the evaluator stages files instead)

def _exec_module(module_name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


_MODULE_CACHE: dict[str, SimpleNamespace] = {}
_LEADERBOARD_MODULES = ("task", "utils", "reference")


@contextlib.contextmanager
def leaderboard_imports(modules: Mapping[str, ModuleType] | None = None):
    """Inside the block, ``import task`` / ``utils`` / ``reference`` resolve to the given modules (as they do in a
    staged run directory); on leaving, those sys.modules entries are put back as they were."""
    saved = {k: sys.modules.get(k) for k in _LEADERBOARD_MODULES}
    sys.modules.update(modules or {})
    try:
        yield
    finally:
        for key, module in saved.items():
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module


def load_modules(name: str) -> SimpleNamespace:
    """Import a problem's task.py, reference.py and utils.py in this process.

    They import each other as the plain modules ``task`` and ``utils`` (as on the leaderboard), so while loading,
    sys.modules['task'/'utils'/'reference'] point at this problem's modules; afterwards the previous entries are
    restored, so several problems can be loaded in one process. Returns SimpleNamespace(task, reference, utils).
    """
    if name in _MODULE_CACHE:
        return _MODULE_CACHE[name]
    folder = problem_dir(name)
    with leaderboard_imports():
        utils = _exec_module("utils", UTILS_PATH)
        task = _exec_module("task", folder / "task.py")
        reference = _exec_module("reference", folder / "reference.py")
    mods = SimpleNamespace(task=task, reference=reference, utils=utils)
    _MODULE_CACHE[name] = mods
    return mods
