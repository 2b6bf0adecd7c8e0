"""How long a generated submission's import takes, twice in fresh processes (load_inline builds, then finds its build in
torch's cache): `python benchmarks/import_probe.py PROBLEM BACKEND`. kbench perf reports the same figure
("submission import"); this isolates it from the harness."""
import subprocess
import sys
import tempfile
from pathlib import Path

from kbench import generator, problems

IMPORT = ("import sys, time; sys.path.insert(0, {task!r}); t = time.perf_counter(); "
          "import importlib.util as u; s = u.spec_from_file_location('submission', {sub!r}); "
          "u.module_from_spec(s).__spec__.loader.exec_module(u.module_from_spec(s)); "
          "print(f'import {{time.perf_counter() - t:.1f}} s')")


def main():
    problem, backend = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        sub = Path(tmp) / "submission.py"
        generator.generate(problem, backend, out=sub)
        task = str(problems.problem_dir(problem))
        for i in (1, 2):
            done = subprocess.run([sys.executable, "-c", IMPORT.format(task=task, sub=str(sub))],
                                  capture_output=True, text=True, cwd=tmp)
            print(f"{problem} {backend} process {i}: {done.stdout.strip() or done.stderr.strip()[-300:]}", flush=True)


if __name__ == "__main__":
    main()
