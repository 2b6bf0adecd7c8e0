"""Rewrite README.md's results tables from benchmarks/results/*.csv (the tables are data, never typed by hand).

    python benchmarks/readme_tables.py            # rewrite the block between the results markers
    python benchmarks/readme_tables.py --check    # exit 1 if the README is stale
"""
import argparse
import sys
from pathlib import Path

from kbench import benchlib

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 if the README is stale")
    args = ap.parse_args()
    current = benchlib.update_readme(ROOT / "README.md", ROOT / "benchmarks" / "results", check=args.check)
    print("README results tables: " + ("current" if current else "stale" if args.check else "rewritten"))
    sys.exit(1 if args.check and not current else 0)


if __name__ == "__main__":
    main()
