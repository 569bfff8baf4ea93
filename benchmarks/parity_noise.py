"""The rounding noise under the parity tests' comparisons (tests/parity.py), measured on this machine.

Runs the parity tests once per setting (thread count x ATEN_CPU_CAPABILITY kernel set) with PARITY_RECORD set, so
that every comparison they make saves both sides, then prints per test and per kind of comparison:

- theirs vs itself: CoMLRL's (or TRL's) side under each setting against the first setting: the noise floor of the
  same code on the same inputs, from rounding alone;
- ours vs itself: the same for our side;
- ours vs theirs: the comparison the test makes, under the worst setting.

Each as max |a - b| / max |b| per tensor (the tolerance's form in tests/parity.py), the max over the test's tensors;
for weights after Adam ("adam"), the share of weights off by more than 1e-3 lr and the largest difference in lr.

    python benchmarks/parity_noise.py                    # 1 and 2 threads x default and avx2 (and avx512 if present)
    python benchmarks/parity_noise.py -k maac_step       # only some tests
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TESTS = [
    "tests/test_actor_critic_math.py",
    "tests/test_preference_math.py",
    "tests/test_equivalence.py",
    "tests/test_actor_critic.py",
    "tests/test_madpo.py",
    "tests/test_madpo_centralized.py",
    "tests/test_marlhf.py",
    "tests/test_marlhf_iter.py",
]
# the tests that compare numbers through tests/parity.py
SELECT = "match or equals or reward_model_scoring or online or reloads"


def capabilities() -> list[str]:
    """The ATen kernel sets this CPU can run, from the plain one up to the one torch picked."""
    best = torch.backends.cpu.get_cpu_capability().lower()
    order = ["default", "avx2", "avx512"]
    return order[: order.index(best) + 1] if best in order else ["default", best]


def run(setting: tuple[int, str], folder: Path, select: str) -> str:
    threads, capability = setting
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), ATEN_CPU_CAPABILITY=capability, PARITY_RECORD=str(folder))
    env.update(HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select, *TESTS]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]


def load(folder: Path) -> dict:
    return {r["key"]: r for r in (torch.load(f, weights_only=False) for f in sorted(folder.glob("*.pt")))}


def excess(a: torch.Tensor, b: torch.Tensor, atol: float) -> float:
    """What the relative tolerance must cover: (max |a - b| beyond the absolute floor `atol`) / max |b|."""
    diff = (a.double() - b.double()).abs().max().item() if b.numel() else 0.0
    scale = b.double().abs().max().item() if b.numel() else 0.0
    over = max(0.0, diff - atol)
    return over / scale if scale > 0 else (0.0 if over == 0 else float("inf"))


def adam(pairs: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> tuple[float, float]:
    """Over one test's weights after Adam at `lr` (x steps): the share off by more than 1e-3 lr (ADAM_CLOSE in
    tests/parity.py), and the largest difference in units of lr."""
    off = sum(int(((a.double() - b.double()).abs() > 1e-3 * lr).sum()) for a, b in pairs)
    worst = max(((a.double() - b.double()).abs().max().item() for a, b in pairs), default=0.0)
    return off / max(1, sum(b.numel() for _, b in pairs)), worst / lr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=SELECT, help="pytest -k expression (default: the parity tests)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--capabilities", default=",".join(capabilities()))
    parser.add_argument("--records", help="keep the records in this folder (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true", help="read the records already in --records, run nothing")
    args = parser.parse_args()
    settings = [(int(t), c) for c in args.capabilities.split(",") for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root, records = Path(args.records or tmp), {}
        for setting in settings:
            folder = root / f"{setting[0]}-{setting[1]}"
            if not args.reuse:
                shutil.rmtree(folder, ignore_errors=True)
                print(
                    f"threads={setting[0]} ATEN_CPU_CAPABILITY={setting[1]}: {run(setting, folder, args.k)}",
                    flush=True,
                )
            records[setting] = load(folder)
    report(settings, records)


def report(settings: list[tuple[int, str]], records: dict) -> None:
    base, *others = settings
    table = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])  # theirs, ours vs itself, ours vs theirs, skipped
    adam_pairs = collections.defaultdict(lambda: collections.defaultdict(list))  # test -> comparison -> pairs
    for key, first in records[base].items():
        instance = key.rsplit("::", 1)[0]  # file::test[parameters]
        function = instance.split("[")[0]
        seen = {s: records[s][key] for s in settings if key in records[s]}
        if len(seen) < len(settings) or any(r["expected"].shape != first["expected"].shape for r in seen.values()):
            table[(function, first["kind"])][3] += 1  # the inputs differ between settings: not rounding noise
            continue
        if first["kind"] == "adam":
            lr = first["atol"]
            for s, r in seen.items():
                adam_pairs[function][("ours vs theirs", instance, s, lr)].append((r["actual"], r["expected"]))
                if s != base:
                    adam_pairs[function][("theirs vs itself", instance, s, lr)].append(
                        (r["expected"], first["expected"])
                    )
                    adam_pairs[function][("ours vs itself", instance, s, lr)].append((r["actual"], first["actual"]))
            continue
        row, atol = table[(function, first["kind"])], first["atol"]
        for s, r in seen.items():
            if s != base:
                row[0] = max(row[0], excess(r["expected"], first["expected"], atol))
                row[1] = max(row[1], excess(r["actual"], first["actual"], atol))
            row[2] = max(row[2], excess(r["actual"], r["expected"], atol))
    names = ", ".join(f"{t} thread(s)/{c}" for t, c in others)
    print(
        "\n(max |a - b| - atol) / max |b| per tensor (atol: the test's absolute floor), max over tensors and settings"
    )
    print(f"'vs itself': {names} against {base[0]} thread(s)/{base[1]}")
    print(f"{'test':<96} {'kind':<9} {'theirs':>9} {'ours':>9} {'ours-vs':>9} {'skipped':>7}")
    print(f"{'':<96} {'':<9} {'vs itself':>9} {'vs itself':>9} {'theirs':>9}")
    for (test, kind), (theirs, ours, versus, skipped) in sorted(table.items()):
        print(f"{test:<96} {kind:<9} {theirs:9.2g} {ours:9.2g} {versus:9.2g} {skipped:7d}")
    for kind in sorted({k for _, k in table}):
        rows = [v for (_, k), v in table.items() if k == kind]
        print(f"{'ALL':<96} {kind:<9} " + " ".join(f"{max(r[i] for r in rows):9.2g}" for i in range(3)))
    if adam_pairs:
        print("\nweights after Adam, per test run and setting: the largest share of weights off by > 1e-3 lr, and")
        print("the largest difference in units of lr (lr x steps)")
        columns = ("theirs vs itself", "ours vs itself", "ours vs theirs")
        print(f"{'test':<96} " + " ".join(f"{c:>22}" for c in columns))
        for test, comparisons in sorted(adam_pairs.items()):
            cells = []
            for column in columns:
                found = [adam(pairs, c[3]) for c, pairs in comparisons.items() if c[0] == column]
                cells.append(f"{max(f for f, _ in found):11.2g} {max(w for _, w in found):9.2g}lr")
            print(f"{test:<96} " + " ".join(cells))


if __name__ == "__main__":
    main()
