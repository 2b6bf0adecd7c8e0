"""Bring measured figures into benchmarks/results/<problem>.csv: the rows a GPU session wrote (benchmark scripts) and
the `kbench perf --json` records it kept (official = benchmark mode, leaderboard).

    python benchmarks/collect.py rows SESSION/results [--rename OLD=NEW ...]
    python benchmarks/collect.py record perf.json --backend cuda [--rename ...]

--rename relabels a backend (and its "<backend>/<stage>" rows) when a session measured a build that is not the one
the backend name now stands for (an experiment that was reverted, an earlier version).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kbench import benchlib

RESULTS = Path(__file__).resolve().parent / "results"


def renamed(backend: str, renames: dict[str, str]) -> str:
    head, sep, tail = backend.partition("/")
    return renames.get(head, head) + sep + tail


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("rows", "record"))
    ap.add_argument("path")
    ap.add_argument("--backend", help="record: the backend the record judged")
    ap.add_argument("--problem", help="record: the problem (default: the record's own)")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW")
    args = ap.parse_args()
    renames = dict(r.split("=", 1) for r in args.rename)
    if args.kind == "rows":
        moved = benchlib.merge(Path(args.path), RESULTS, rename=lambda b: renamed(b, renames))
        print(f"{moved} rows into {RESULTS}")
        return
    record = json.loads(Path(args.path).read_text())
    backend = renamed(args.backend or record["environment"].get("backend") or "submission", renames)
    rows = benchlib.rows_from_record(record, backend)
    benchlib.record(args.problem or record["problem"], rows, RESULTS)
    print(f"{record['problem']}: {len(rows)} rows ({rows[0].metric if rows else 'none'})")


if __name__ == "__main__":
    main()
