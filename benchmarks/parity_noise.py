"""The rounding noise under the parity tests' comparisons (tests/parity.py), measured on this machine.

Runs the parity tests once per setting (thread count x ATEN_CPU_CAPABILITY kernel set) with PARITY_RECORD set, so
that every comparison they make saves both sides, then prints per test and per kind of comparison:

- theirs vs itself: CoMLRL's (or TRL's) side under each setting against the first setting: the noise floor of the
  same code on the same inputs, from rounding alone;
- ours vs itself: the same for our side;
- ours vs theirs: the comparison the test makes, under the worst setting.

Each as max |a - b| / max |b| per tensor (the tolerance's form in tests/parity.py), the max over the test's tensors;
for weights after Adam ("adam"), the max |a - b| and the count of weights off by more than 1e-6 instead.

    python benchmarks/parity_noise.py                    # 1 and 2 threads x default and avx2 (and avx512 if present)
    python benchmarks/parity_noise.py -k maac_step       # only some tests
"""

from __future__ import annotations

import argparse
import collections
import os
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
SELECT = "match or equals or reward_model_scoring"  # the tests that compare numbers through tests/parity.py


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


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = (a.double() - b.double()).abs().max().item() if b.numel() else 0.0
    scale = b.double().abs().max().item() if b.numel() else 0.0
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def adam(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    diff = (a.double() - b.double()).abs()
    return (diff.max().item() if diff.numel() else 0.0), int((diff > 1e-6).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=SELECT, help="pytest -k expression (default: the parity tests)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--capabilities", default=",".join(capabilities()))
    args = parser.parse_args()
    settings = [(int(t), c) for c in args.capabilities.split(",") for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        records = {}
        for setting in settings:
            folder = Path(tmp) / f"{setting[0]}-{setting[1]}"
            print(f"threads={setting[0]} ATEN_CPU_CAPABILITY={setting[1]}: {run(setting, folder, args.k)}", flush=True)
            records[setting] = load(folder)
    base, *others = settings
    # per (test function, kind): [theirs vs itself, ours vs itself, ours vs theirs], and skipped keys
    table = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    adam_rows = collections.defaultdict(lambda: [0.0, 0, 0.0, 0, 0.0, 0, 0])
    for key, first in records[base].items():
        test = key.split("::")[0] + "::" + key.split("::")[1].split("[")[0]
        kind = first["kind"]
        seen = [records[s][key] for s in settings if key in records[s]]
        if len(seen) < len(settings) or any(r["expected"].shape != first["expected"].shape for r in seen):
            table[(test, kind)][3] += 1  # inputs differ between settings (another sampled completion): not noise
            continue
        if kind == "adam":
            row = adam_rows[test]
            for r in seen[1:]:
                for offset, pair in ((0, (r["expected"], first["expected"])), (2, (r["actual"], first["actual"]))):
                    worst, count = adam(*pair)
                    row[offset], row[offset + 1] = max(row[offset], worst), row[offset + 1] + count
            for r in seen:
                worst, count = adam(r["actual"], r["expected"])
                row[4], row[5] = max(row[4], worst), row[5] + count
            row[6] += first["expected"].numel() * len(seen)
            continue
        row = table[(test, kind)]
        for r in seen[1:]:
            row[0] = max(row[0], rel(r["expected"], first["expected"]))
            row[1] = max(row[1], rel(r["actual"], first["actual"]))
        row[2] = max([row[2]] + [rel(r["actual"], r["expected"]) for r in seen])
    names = ", ".join(f"{t} thread(s)/{c}" for t, c in others)
    print(f"\nmax |a - b| / max |b| per tensor, max over tensors; 'vs itself': each of {names} against {base}")
    print(f"{'test':<86} {'kind':<9} {'theirs':>9} {'ours':>9} {'ours-vs':>9} {'skipped':>7}")
    print(f"{'':<86} {'':<9} {'vs itself':>9} {'vs itself':>9} {'theirs':>9}")
    for (test, kind), (theirs, ours, versus, skipped) in sorted(table.items()):
        print(f"{test:<86} {kind:<9} {theirs:9.2g} {ours:9.2g} {versus:9.2g} {skipped:7d}")
    for kind in sorted({k for _, k in table}):
        rows = [v for (_, k), v in table.items() if k == kind]
        print(f"{'ALL':<86} {kind:<9} " + " ".join(f"{max(r[i] for r in rows):9.2g}" for i in range(3)))
    if adam_rows:
        print("\nweights after Adam: max |a - b|, and how many weights (of all, over settings) differ by > 1e-6")
        print(f"{'test':<86} {'theirs vs itself':>18} {'ours vs itself':>18} {'ours vs theirs':>18} {'weights':>9}")
        for test, r in sorted(adam_rows.items()):
            cells = " ".join(f"{r[i]:9.2g} {r[i + 1]:8d}" for i in (0, 2, 4))
            print(f"{test:<86} {cells} {r[6]:9d}")


if __name__ == "__main__":
    main()
