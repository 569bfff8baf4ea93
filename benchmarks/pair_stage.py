"""RLHF's pair stage (`preference.sampling.collect_preference_pairs`) on the tutorial team
(`compare_comlrl.ours_trainer`): K joint candidates of each of the 10 training prompts, drawn one prompt per
`generate` call (CoMLRL's loop) against several prompts per call (what `MultiAgentRLHFTrainer` draws:
`generation_batch_size // K` prompts), side by side in one process, alternating rounds; prints the median seconds of
each and the ratio.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/pair_stage.py --candidates 8 --items 1 10 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_comlrl as shared  # noqa: E402

from multiagent_trl.preference.sampling import collect_preference_pairs  # noqa: E402
from multiagent_trl.testing import tiny_model_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=int, default=8, help="K joint candidates per prompt.")
    parser.add_argument("--items", type=int, nargs="+", default=[1, 10], help="Prompts per call; the first is 1x.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as output_dir:
        settings = shared.Settings(num_generations=args.candidates)  # the tutorial team, as compare_comlrl builds it
        trainer = shared.ours_trainer(
            settings, tiny_model_path(), output_dir, epochs=1, seed=0, advantage_mode="mean",
            reward=shared.proper_length_ratio_reward,
        )  # fmt: skip
        seconds = {items: [] for items in args.items}
        for _ in range(args.rounds):
            for items in args.items:
                start = time.perf_counter()
                collect_preference_pairs(trainer, trainer.train_dataset, args.candidates, items_per_call=items)
                seconds[items].append(time.perf_counter() - start)
    base = statistics.median(seconds[args.items[0]])
    print(f"{len(shared.TRAIN_PROMPTS)} prompts, K {args.candidates}, 2 agents, median of {args.rounds} rounds:")
    for items, times in seconds.items():
        median = statistics.median(times)
        print(f"  {items:>3} prompt(s) per call: {median:.2f} s ({median / base:.2f}x)")


if __name__ == "__main__":
    main()
