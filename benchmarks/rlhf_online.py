"""The native `MultiAgentRLHFTrainer` on the tutorial's story length-ratio task, offline: the reward-model stage with
enough pairs to rank held-out pairs at about 0.75 (`reward_model_heldout.py`'s `sum-2560`: span sums, K 32
candidates and 256 pairs by reward gap on each of the 10 training prompts, learning rate 1e-3, 2 epochs of 16
pairs), then online MAGRPO on the reward model's scores (G 8, 2 prompts per step, CoMLRL's optimizer), scored on
the held-out prompts with the task reward every 20 steps (`compare_comlrl.heldout_rewards`, x100, one random stream).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/rlhf_online.py --seed 0 --epochs 40
    python benchmarks/rlhf_online.py --seed 0 --epochs 40 --config '{"beta": 0.04, "learning_rate": 1e-3}'

`--config` overrides `MultiAgentRLHFConfig` fields (JSON). `--rounds R` trains the iterative form instead
(`MultiAgentIterativeRLHFTrainer`: R rounds of `--epochs / R` epochs, each drawing fresh pairs from the current agents
and training the reward model on them before its online epochs; `--config` then takes its round fields too):

    python benchmarks/rlhf_online.py --seed 0 --epochs 40 --rounds 8 --config '{"preference_num_candidates": 16,
        "preference_pairs_per_sample": 64, "reward_num_train_epochs": 1, "replay_mode": "all_history"}'

Prints each held-out point; `--json-out` keeps them.
docs/benchmarks.md ("MARLHF's reward model, held out") has the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_comlrl as shared  # noqa: E402
from learning_curves import CurveSettings, shared_settings  # noqa: E402

from multiagent_trl import (  # noqa: E402
    MultiAgentIterativeRLHFConfig,
    MultiAgentIterativeRLHFTrainer,
    MultiAgentRLHFConfig,
    MultiAgentRLHFTrainer,
)
from multiagent_trl.testing import tiny_model_path  # noqa: E402

SCORE_EVERY = 20  # optimizer steps between held-out scores
SAMPLES_PER_STEP = 16  # per agent: 2 prompts x G 8


class HeldOutScores(TrainerCallback):
    """The task reward on the held-out prompts at the start, every `SCORE_EVERY` steps, and when called."""

    def __init__(self, tokenizer, settings) -> None:
        self.tokenizer, self.settings, self.trainer, self.points = tokenizer, settings, None, []

    def score(self, step: int) -> None:
        agents = list(self.trainer.model.agents)
        modes, state = [agent.training for agent in agents], torch.get_rng_state()
        rewards = shared.heldout_rewards(agents, self.tokenizer, self.settings, 0)
        value = shared.REWARD_SCALE * statistics.fmean(rewards)
        for agent, mode in zip(agents, modes):
            agent.train(mode)
        torch.set_rng_state(state)
        self.points.append((step * SAMPLES_PER_STEP, value))
        print(f"samples per agent {step * SAMPLES_PER_STEP:>5}: held-out reward {value:.1f}", flush=True)

    def on_train_begin(self, args, state, control, **kwargs):
        self.score(0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % SCORE_EVERY == 0:
            self.score(state.global_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=40, help="Online epochs over the 10 prompts (80 samples each).")
    parser.add_argument("--config", default="{}", help="MultiAgentRLHFConfig fields to override (JSON).")
    parser.add_argument("--rounds", type=int, default=0, help="Iterative RLHF: rounds of fresh pairs (0: one stage).")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    shared.seed_everything(args.seed, 1)
    path = tiny_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    settings = shared_settings(CurveSettings(eval_samples=8), "magrpo")
    scores = HeldOutScores(tokenizer, settings)
    with tempfile.TemporaryDirectory() as output_dir:
        fields = dict(
            output_dir=output_dir, num_train_epochs=args.epochs, learning_rate=3e-3, num_agents=2, num_generations=8,
            per_device_train_batch_size=SAMPLES_PER_STEP, steps_per_generation=1,
            max_completion_length=settings.max_new_tokens, temperature=settings.temperature, top_p=settings.top_p,
            top_k=settings.top_k, shuffle_dataset=False, logging_steps=1, seed=args.seed, report_to="none",
            save_strategy="no", disable_tqdm=True, preference_num_candidates=32, preference_pairs_per_sample=256,
            pair_selection="reward_gap", reward_model_name=path, reward_learning_rate=1e-3, reward_num_train_epochs=2,
            reward_train_batch_size=16, **shared.MATCHED_OPTIMIZER,
        )  # fmt: skip
        config_cls, trainer_cls = MultiAgentRLHFConfig, MultiAgentRLHFTrainer
        if args.rounds:
            config_cls, trainer_cls = MultiAgentIterativeRLHFConfig, MultiAgentIterativeRLHFTrainer
            fields["epochs_per_round"] = args.epochs // args.rounds
        fields.update(json.loads(args.config))
        trainer = trainer_cls(
            model=[AutoModelForCausalLM.from_pretrained(path) for _ in range(2)],
            reward_funcs=shared.ScaledReward(shared.proper_length_ratio_reward),
            args=config_cls(**fields),
            train_dataset=Dataset.from_dict({"prompt": shared.TRAIN_PROMPTS}),
            processing_class=tokenizer,
            callbacks=[scores],
        )
        scores.trainer = trainer
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
        scores.score(trainer.state.global_step)
    print(f"pairs {len(trainer.preference_pairs)}, train() {wall:.0f} s", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"points": scores.points, "seconds": wall, "config": args.config}))


if __name__ == "__main__":
    main()
