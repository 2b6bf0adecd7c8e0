"""The GPU's SM clock, power and clock-event reasons while a command runs (nvidia-smi sampled every 20 ms): whether a
kernel ran at the board's power cap, and at what clock (docs/moe-notes.md, twenty-first session).

    python benchmarks/power_trace.py [--every-ms 20] -- kbench perf moe --backend cuda

Prints the command's output, then one line per second of samples taken while the GPU was busy (utilization >= 50%)
and a summary: median / min / max SM clock and power, and the share of busy samples with the software power cap
(clock event reason bit 0x4) set. Leaves the GPU's settings alone: it only reads them."""
import argparse
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

FIELDS = "timestamp,utilization.gpu,clocks.sm,power.draw,clocks_event_reasons.active"
SW_POWER_CAP = 0x4


def parse(line: str):
    """(hh:mm:ss, utilization %, SM MHz, watts, reasons) of one nvidia-smi CSV line, or None."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None
    try:
        return (parts[0].split(" ")[-1][:8], int(parts[1].split()[0]), int(parts[2].split()[0]),
                float(parts[3].split()[0]), int(parts[4], 16))
    except ValueError:
        return None


def summarize(samples: list) -> list[str]:
    busy = [s for s in samples if s[1] >= 50]
    if not busy:
        return ["power trace: no busy samples"]
    lines = []
    by_second = defaultdict(list)
    for s in busy:
        by_second[s[0]].append(s)
    for second, group in sorted(by_second.items()):
        lines.append(f"  {second}  {statistics.median(g[2] for g in group):6.0f} MHz  "
                     f"{statistics.median(g[3] for g in group):6.1f} W  "
                     f"power cap {sum(bool(g[4] & SW_POWER_CAP) for g in group)}/{len(group)}")
    clocks, watts = [s[2] for s in busy], [s[3] for s in busy]
    capped = sum(bool(s[4] & SW_POWER_CAP) for s in busy) / len(busy)
    lines.append(f"power trace: {len(busy)} busy samples; SM clock median {statistics.median(clocks):.0f} MHz "
                 f"(min {min(clocks)}, max {max(clocks)}); power median {statistics.median(watts):.1f} W "
                 f"(max {max(watts):.1f}); software power cap in {capped:.0%} of them")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every-ms", type=int, default=20)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("name the command to run after --")
    with tempfile.NamedTemporaryFile("w+", suffix=".csv") as log:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader",
                                "--loop-ms", str(args.every_ms)], stdout=log, stderr=subprocess.DEVNULL)
        try:
            rc = subprocess.call(cmd)
        finally:
            smi.terminate()
            smi.wait()
        log.seek(0)
        samples = [s for s in map(parse, log) if s]
    print("\n".join(summarize(samples)), flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
