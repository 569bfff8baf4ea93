"""Trains the preference family's pair stages under `accelerate launch --num_processes 2` and writes what the test
checks (`tests/test_preference_distributed.py`).

Each rank writes `rank{r}.json`: a fingerprint of every agent's weights before and after training and of the reward
model (RLHF), every pair record the rank trained on (iterative DPO), the last round's training pairs, the replay
folder's files, and the rounds' logs. Each rank seeds torch and Python's random differently before training: in a
real run the ranks' random states part as soon as anything draws a different number of numbers on each (generation
that stops early on one rank, a reward that samples, a random pair selection), and what all ranks must agree on (the
pairs, the reward model) must not depend on them being equal.
"""

import json
import os
import random
import sys

import torch
from datasets import Dataset

from multiagent_trl import (
    ActorCriticRLHFConfig,
    ActorCriticRLHFTrainer,
    MultiAgentIterativeRLHFConfig,
    MultiAgentIterativeRLHFTrainer,
    MultiAgentRLHFConfig,
    MultiAgentRLHFTrainer,
)
from multiagent_trl.preference.iterative import MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer
from multiagent_trl.testing import end_launched_process, tiny_model_path

ROWS = 7  # uneven: 4 rows for rank 0, 3 for rank 1; with 2 prompts per draw call rank 1's second call is short


def length_reward(completions1, completions2):
    return [float(len(a) + 2 * len(b)) for a, b in zip(completions1, completions2)]


class ServedPairs(MultiAgentIterativeDPOTrainer):
    """Records every pair record the rank trained on (iterative DPO), with `global_step` when its batch was built."""

    served: list

    def record_token_ids(self, record):
        pair = [self.state.global_step, record["prompts"], record["winner_completions"], record["loser_completions"]]
        self.served = [*getattr(self, "served", []), pair]
        return super().record_token_ids(record)


def build(out_dir: str, kind: str):
    common = dict(
        output_dir=f"{out_dir}/run",
        num_agents=2,
        per_device_train_batch_size=4,
        max_completion_length=8,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        preference_pairs_per_sample=2,
    )
    dataset = Dataset.from_dict({"prompt": [f"Row {i}: say something." for i in range(ROWS)]})
    model = tiny_model_path()
    if kind == "rlhf":
        args = MultiAgentRLHFConfig(
            **common, num_generations=4, max_steps=2, preference_num_candidates=4, reward_learning_rate=1e-2
        )
        return MultiAgentRLHFTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=dataset)
    if kind == "actor_critic_rlhf":  # a joint critic online
        args = ActorCriticRLHFConfig(
            **common, num_generations=1, joint_critic=True, max_steps=2, preference_num_candidates=4,
            reward_learning_rate=1e-2,
        )  # fmt: skip
        return ActorCriticRLHFTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=dataset)
    if kind == "iterative_rlhf":
        args = MultiAgentIterativeRLHFConfig(
            **common, num_generations=4, num_train_epochs=2, max_steps=-1, steps_per_generation=2,
            preference_num_candidates=3, reward_learning_rate=1e-2, comparator="history", comparator_history_k=2,
        )  # fmt: skip
        return MultiAgentIterativeRLHFTrainer(
            model=model, reward_funcs=length_reward, args=args, train_dataset=dataset
        )
    batches = {}
    if kind == "iterative_dpo_batches":  # and a replay sample, drawn with Python's random
        batches = dict(pair_batch_size=2, replay_mode="all_history", replay_sample_size=10)
    if kind == "iterative_resume":  # 3 rounds of 4 steps, a checkpoint every 2
        batches = dict(num_train_epochs=3, save_strategy="steps", save_steps=2)
    args = MultiAgentIterativeDPOConfig(
        **{**common, "num_train_epochs": 2, **batches}, num_generations=4, max_steps=-1, steps_per_generation=2,
        comparator="history", comparator_history_k=2,
    )  # fmt: skip
    return ServedPairs(model=model, reward_funcs=length_reward, args=args, train_dataset=dataset)


def main(out_dir: str, kind: str) -> None:
    trainer = build(out_dir, kind)
    team, rank = trainer.model, trainer.accelerator.process_index

    def fingerprint(model, count):
        parts = [model.agent_parameters(i) for i in range(count)] if count else [model.parameters()]
        return [[float(p.detach().double().sum()) for p in params] for params in parts]

    initial = fingerprint(team, 2)
    torch.manual_seed(1000 + rank)  # the ranks' random states part (see the module docstring)
    random.seed(1000 + rank)
    if kind == "iterative_resume":  # a run, then a new trainer resumed from its checkpoint inside round 2
        trainer.train()
        trainer = build(out_dir, kind)
        team = trainer.model
        trainer.train(resume_from_checkpoint=f"{out_dir}/run/checkpoint-6")
    else:
        trainer.train()
    replay = os.path.join(trainer.args.output_dir, "preference_replay")
    result = {
        "world": trainer.accelerator.num_processes,
        "initial": initial,
        "fingerprint": fingerprint(team, 2),
        "reward_model": fingerprint(trainer.reward_model, 0) if hasattr(trainer, "reward_model") else None,
        "served": getattr(trainer, "served", []),
        "pair_prompts": [pair.prompts[0] for pair in getattr(trainer, "preference_pairs", [])],
        "round_pairs": [[r["prompts"], r["winner_completions"], r["loser_completions"]] for r in trainer.round_pairs]
        if hasattr(trainer, "round_pairs")
        else [],
        "replay": sorted(os.listdir(replay)) if os.path.isdir(replay) else [],
        "logs": [h for h in trainer.state.log_history if "round/pairs" in h],
        "global_step": trainer.state.global_step,
    }
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_launched_process()
