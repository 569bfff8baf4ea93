"""Held-out ranking accuracy of MARLHF's joint reward model on the tutorial's story length-ratio task, offline.

The reward model's stage of MARLHF, alone: joint samples drawn from the tiny model (`multiagent_trl.testing
.tiny_model_path()`, both agents the same initial weights, both given the same tutorial prompt, `generate` with the
benchmark's sampling: temperature 0.6, top_p 0.6, top_k 50, 32 new tokens), scored by the task reward
(`proper_length_ratio_reward`: agent 2's characters over agent 1's in [2, 3]), CoMLRL's pair selection per prompt
(`preference.pairs.select_pairs`), a `JointRewardModel` trained on them by `train_reward_model`. The measure is the
share of held-out pairs the trained model ranks as the task reward does: fresh joint samples on the 10 held-out
prompts of `compare_comlrl.py` (`--heldout-samples` per prompt, one fixed random stream for every variant), every
pair of samples of one prompt with distinct rewards.

The baseline is CoMLRL's setting as `compare_comlrl.py --family preference` runs MARLHF: the 10 training prompts, K 8
candidates, 4 pairs per prompt (`reward_gap`), reward learning rate 1e-3, 2 epochs, 4 pairs per step, AdamW weight
decay 0.01, the last token pooled, the backbone trained. Each variant changes some of these (`VARIANTS`); every one
runs on `--seeds` (the seed draws the training samples, the head and the batch order).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 nice -n 15 python benchmarks/reward_model_heldout.py --seeds 0 1 2
    python benchmarks/reward_model_heldout.py --variants comlrl spans-sum --seeds 0   # a few variants

Beside each variant it also prints the bag-of-tokens reference on the variant's own training pairs: a logistic
ranker on each response's token counts (`bag_of_tokens_accuracy`), the best a linear score on the tokens can learn
from that many pairs, with no backbone in the way; it says whether a variant is short of pairs or of features.

It first prints two references: the held-out accuracy of ranking by the ratio of the two responses' characters (what
the task reward reads) and of their UTF-8 bytes, which is what counting tokens gives with the tiny model's byte-level
tokenizer (its random completions decode to many replacement characters, 3 bytes each). Then one row per variant:
mean, min and max held-out accuracy over the seeds, the training accuracy of the last epoch, the pairs, seconds per
run. `--json-out` keeps every run. docs/benchmarks.md ("MARLHF's reward model, held out") has the numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_comlrl import HELDOUT_PROMPTS, TRAIN_PROMPTS, proper_length_ratio_reward  # noqa: E402

from multiagent_trl.preference.reward_model import JointRewardModel  # noqa: E402
from multiagent_trl.preference.reward_training import pairs_from_candidates, train_reward_model  # noqa: E402
from multiagent_trl.testing import tiny_model_path  # noqa: E402

HELDOUT_SEED = 4242  # one held-out set for every variant and seed


@dataclass(frozen=True)
class Setting:
    """One reward-model setting; the defaults are CoMLRL's as compare_comlrl.py's preference family runs MARLHF."""

    items: int = 10  # prompts sampled for pairs (the 10 training prompts, cycled with fresh samples beyond 10)
    candidates: int = 8  # K joint candidates per item
    pairs_per_sample: int | None = 4
    pair_selection: str = "reward_gap"
    learning_rate: float = 1e-3
    epochs: int = 2
    batch_size: int = 4
    weight_decay: float = 0.01
    pooling: str = "last"
    freeze_backbone: bool = False
    margin_scale: float = 0.0
    ensemble: int = 1


BASE = Setting()
VARIANTS = {
    "comlrl": BASE,
    # more (and other) pairs
    "all-pairs": replace(BASE, pair_selection="all", pairs_per_sample=None),
    "items-40": replace(BASE, items=40),
    "k16-pairs16": replace(BASE, candidates=16, pairs_per_sample=16),
    "random-pairs": replace(BASE, pair_selection="random"),
    # optimisation
    "lr-1e-4": replace(BASE, learning_rate=1e-4),
    "lr-3e-3": replace(BASE, learning_rate=3e-3),
    "epochs-8": replace(BASE, epochs=8),
    "wd-0.1": replace(BASE, weight_decay=0.1),
    "frozen": replace(BASE, freeze_backbone=True),
    "margin-5": replace(BASE, margin_scale=5.0),
    "ensemble-4": replace(BASE, ensemble=4),
    # what the head reads
    "mean": replace(BASE, pooling="mean"),
    "spans-mean": replace(BASE, pooling="spans"),
    "spans-sum": replace(BASE, pooling="span_sums"),
}
SUMS = replace(BASE, pooling="span_sums")
# every pair of each item's 8 candidates; the head alone trains, on a frozen backbone's span sums
FROZEN_ALL = replace(SUMS, pair_selection="all", pairs_per_sample=None, freeze_backbone=True, learning_rate=1e-2)
FROZEN_ALL = replace(FROZEN_ALL, epochs=8, batch_size=64)
VARIANTS.update(
    {  # the span sums with each other lever
        "sum-frozen": replace(SUMS, freeze_backbone=True),
        "sum-frozen-lr1e-2": replace(SUMS, freeze_backbone=True, learning_rate=1e-2),
        "sum-lr-1e-4": replace(SUMS, learning_rate=1e-4),
        "sum-lr-3e-3": replace(SUMS, learning_rate=3e-3),
        "sum-epochs-8": replace(SUMS, epochs=8),
        "sum-wd-0.1": replace(SUMS, weight_decay=0.1),
        "sum-margin-5": replace(SUMS, margin_scale=5.0),
        "sum-all-pairs": replace(SUMS, pair_selection="all", pairs_per_sample=None),
        "sum-items-40": replace(SUMS, items=40),
        "sum-ensemble-4": replace(SUMS, ensemble=4),
        # more pairs and steps together: 40 items, 8 pairs each, 4 epochs of 8-pair batches
        "sum-big": replace(SUMS, items=40, pairs_per_sample=8, epochs=4, batch_size=8),
        "sum-big-e8": replace(SUMS, items=40, pairs_per_sample=8, epochs=8, batch_size=8),
        # the pair budget the bag-of-tokens reference needs for 0.7: 320 items of 8 pairs (2,560 pairs)
        "sum-2560": replace(SUMS, items=320, pairs_per_sample=8, epochs=2, batch_size=16),
        # FROZEN_ALL on 40 items (about 1,040 pairs) and 160 (about 4,180)
        "sum-frozen-all-40": replace(FROZEN_ALL, items=40),
        "sum-frozen-all-160": replace(FROZEN_ALL, items=160),
        "sum-big-frozen": replace(
            SUMS, items=40, pairs_per_sample=8, epochs=4, batch_size=8, freeze_backbone=True, learning_rate=1e-2
        ),  # fmt: skip
    }
)


def sample_joint(model, tokenizer, prompts: list[str], per_prompt: int, seed: int) -> list[list[tuple[str, str]]]:
    """`per_prompt` joint samples per prompt: both agents (the same initial model) answer the prompt independently."""
    out = []
    for index, prompt in enumerate(prompts):
        encoded = tokenizer(prompt, return_tensors="pt")
        texts = []
        for agent in range(2):
            torch.manual_seed(seed * 100_003 + 10 * index + agent)
            with torch.inference_mode():
                output = model.generate(
                    **encoded,
                    do_sample=True,
                    temperature=0.6,
                    top_p=0.6,
                    top_k=50,
                    max_new_tokens=32,
                    num_return_sequences=per_prompt,
                    pad_token_id=tokenizer.pad_token_id,
                )
            texts.append(tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True))
        out.append(list(zip(texts[0], texts[1])))
    return out


def heldout_pairs(samples) -> list[tuple[int, int]]:
    """Indices `(winner, loser)` into the flat list of held-out samples: each same-prompt pair of distinct rewards."""
    pairs, offset = [], 0
    for joint in samples:
        rewards = proper_length_ratio_reward([a for a, _ in joint], [b for _, b in joint])
        for i in range(len(joint)):
            for j in range(len(joint)):
                if rewards[i] > rewards[j]:
                    pairs.append((offset + i, offset + j))
        offset += len(joint)
    return pairs


def score_all(model: JointRewardModel, prompts, joints, batch: int = 32) -> torch.Tensor:
    scores = []
    with torch.no_grad():
        for start in range(0, len(joints), batch):
            scores.append(model.score_joint(prompts[start : start + batch], joints[start : start + batch]))
    return torch.cat(scores).float()


def token_counts(tokenizer, joints) -> torch.Tensor:
    """`(B, N * V)`: each agent's response as counts of the tokenizer's `V` tokens, agents side by side."""
    size = len(tokenizer)
    counts = torch.zeros(len(joints), len(joints[0]) * size)
    for row, joint in enumerate(joints):
        for agent, text in enumerate(joint):
            for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
                counts[row, agent * size + token] += 1
    return counts


def bag_of_tokens_accuracy(tokenizer, pairs, heldout, seed: int, steps: int = 500) -> float:
    """Held-out accuracy of a logistic (Bradley-Terry) ranker that is linear in the responses' token counts, fitted on
    `pairs` (Adam, learning rate 1e-2, L2 1e-3): what the pairs alone teach a linear score on the tokens."""
    chosen = token_counts(tokenizer, [p.chosen for p in pairs])
    rejected = token_counts(tokenizer, [p.rejected for p in pairs])
    torch.manual_seed(seed)
    weights = torch.zeros(chosen.shape[1], requires_grad=True)
    optimizer = torch.optim.Adam([weights], lr=1e-2)
    for _ in range(steps):
        loss = -torch.nn.functional.logsigmoid((chosen - rejected) @ weights).mean() + 1e-3 * weights.square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    scores = token_counts(tokenizer, heldout[1]) @ weights.detach()
    return statistics.mean(float(scores[w] > scores[lose]) for w, lose in heldout[2])


def run(setting: Setting, seed: int, path: str, heldout) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(path)
    sampler = AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = [TRAIN_PROMPTS[i % len(TRAIN_PROMPTS)] for i in range(setting.items)]
    random.seed(seed)
    pairs = []
    for prompt, joint in zip(prompts, sample_joint(sampler, tokenizer, prompts, setting.candidates, seed)):
        rewards = proper_length_ratio_reward([a for a, _ in joint], [b for _, b in joint])
        pairs += pairs_from_candidates(
            (prompt, prompt), joint, rewards, setting.pair_selection, setting.pairs_per_sample
        )
    held_prompts, held_joints, held_pairs = heldout
    bag_of_tokens = bag_of_tokens_accuracy(tokenizer, pairs, heldout, seed)
    start = time.perf_counter()
    total, train_accuracy = torch.zeros(len(held_joints)), []
    for member in range(setting.ensemble):
        torch.manual_seed(seed * 1000 + member)
        model = JointRewardModel.from_causal_lm(
            path, freeze_backbone=setting.freeze_backbone, pooling=setting.pooling, num_agents=2
        )
        history = train_reward_model(
            model,
            pairs,
            learning_rate=setting.learning_rate,
            num_train_epochs=setting.epochs,
            batch_size=setting.batch_size,
            weight_decay=setting.weight_decay,
            margin_scale=setting.margin_scale,
        )
        last = [h["accuracy"] for h in history if h["epoch"] == history[-1]["epoch"]]
        train_accuracy.append(sum(last) / len(last))
        scores = score_all(model, held_prompts, held_joints)
        total += (scores - scores.mean()) / scores.std().clamp(min=1e-8)  # members on one scale
    correct = sum(float(total[w] > total[lose]) for w, lose in held_pairs)
    return {
        "seed": seed,
        "pairs": len(pairs),
        "heldout_pairs": len(held_pairs),
        "heldout_accuracy": correct / len(held_pairs),
        "train_accuracy": statistics.mean(train_accuracy),
        "bag_of_tokens_accuracy": bag_of_tokens,
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--heldout-samples", type=int, default=16, help="Joint samples per held-out prompt.")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = tiny_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    sampler = AutoModelForCausalLM.from_pretrained(path).eval()
    samples = sample_joint(sampler, tokenizer, HELDOUT_PROMPTS, args.heldout_samples, HELDOUT_SEED)
    held_prompts = [(p, p) for p, joint in zip(HELDOUT_PROMPTS, samples) for _ in joint]
    held_joints = [pair for joint in samples for pair in joint]
    heldout = (held_prompts, held_joints, heldout_pairs(samples))
    print(f"held out: {len(held_joints)} joint samples, {len(heldout[2])} pairs with distinct rewards", flush=True)
    for name, length in (("characters", len), ("UTF-8 bytes (= tokens)", lambda text: len(text.encode("utf-8")))):
        ratios = [length(b) / max(length(a), 1) for a, b in held_joints]
        share = statistics.mean(float(ratios[w] > ratios[lose]) for w, lose in heldout[2])
        print(f"ranked by the ratio of the responses' {name}: {share:.3f}", flush=True)
    header = f"{'variant':<14} {'held-out acc (mean [min, max])':<32} {'train acc':>9} {'pairs':>6} {'s/run':>6}"
    print(f"{header} {'bag of tokens':>13}")
    results = {}
    for name in args.variants:
        runs = [run(VARIANTS[name], seed, path, heldout) for seed in args.seeds]
        accuracy = [r["heldout_accuracy"] for r in runs]
        results[name] = {"setting": asdict(VARIANTS[name]), "runs": runs}
        print(
            f"{name:<14} {statistics.mean(accuracy):.3f} [{min(accuracy):.3f}, {max(accuracy):.3f}]{'':<14} "
            f"{statistics.mean(r['train_accuracy'] for r in runs):>9.3f} {runs[0]['pairs']:>6} "
            f"{statistics.mean(r['seconds'] for r in runs):>6.1f} "
            f"{statistics.mean(r['bag_of_tokens_accuracy'] for r in runs):>13.3f}",
            flush=True,
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
