"""Bring measured figures into benchmarks/results/<problem>.csv: the rows a GPU session wrote (benchmark scripts) and
the `kbench perf --json` records it kept (official = benchmark mode, leaderboard).

    python benchmarks/collect.py rows SESSION/results [--rename OLD=NEW ...]
    python benchmarks/collect.py record perf.json --backend cuda [--rename ...]

--rename relabels a backend (and its "<backend>/<stage>" rows) when a session measured a build that is not the one
the backend name now stands for (an experiment that was reverted, an earlier version).
"""
from __future__ import annotations

import argparse
import csv
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
        for path in sorted(Path(args.path).glob("*.csv")):
            rows = benchlib.read(path)
            for r in rows:
                r["backend"] = renamed(r["backend"], renames)
            out = RESULTS / path.name
            new = not out.is_file()
            with open(out, "a", newline="") as f:
                w = csv.writer(f)
                if new:
                    w.writerow(benchlib.COLUMNS)
                for r in rows:
                    w.writerow([r[c] for c in benchlib.COLUMNS])
            print(f"{path.name}: {len(rows)} rows")
        return
    record = json.loads(Path(args.path).read_text())
    backend = renamed(args.backend or record["environment"].get("backend") or "submission", renames)
    rows = benchlib.rows_from_record(record, backend)
    benchlib.record(args.problem or record["problem"], rows, RESULTS)
    print(f"{record['problem']}: {len(rows)} rows ({rows[0].metric if rows else 'none'})")


if __name__ == "__main__":
    main()
