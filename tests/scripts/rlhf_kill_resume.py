"""The native RLHF recipe of docs/preference.md on a 2-agent tiny team, for tests/test_kill_resume.py.

Usage: `python tests/scripts/rlhf_kill_resume.py OUT_DIR MODE`. `MultiAgentRLHFTrainer` draws pairs from the team,
trains the reward model, then trains the team for `MAX_STEPS` steps on its scores, saving every `SAVE_STEPS` (each
checkpoint with `reward_model/`). The trainer's output dir is `OUT_DIR/run`; a run that ends writes the team's and the
reward model's final weights to `OUT_DIR/weights.pt` and `OUT_DIR/reward_model.pt`, and its global step, the steps it
ran and the reward-model steps it trained to `OUT_DIR/result.json`. MODE:

- `straight`: train from scratch.
- `slow`: train from scratch, sleeping after every step, so the test has time to kill it mid-run.
- `resume`: `train(resume_from_checkpoint=True)` in `OUT_DIR/run`.
"""

import json
import os
import sys
import time

import torch
from datasets import Dataset
from transformers import TrainerCallback

from multiagent_trl import MultiAgentRLHFConfig, MultiAgentRLHFTrainer
from multiagent_trl.testing import tiny_model_path

MAX_STEPS = 6
SAVE_STEPS = 2


def length_ratio(completions1, completions2):
    """The task reward: the second answer about twice as long as the first."""
    return [-abs(len(b) / (1 + len(a)) - 2.0) for a, b in zip(completions1, completions2)]


class RecordSteps(TrainerCallback):
    """Records the steps this process ran; with `sleep`, pauses after each one."""

    def __init__(self, sleep: float):
        self.sleep, self.steps = sleep, []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)
        time.sleep(self.sleep)


def main(out_dir: str, mode: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the reward head is drawn at construction
    prompts = ["Describe a city in the clouds:", "Invent a new holiday:", "Tell a joke about dinosaurs:"]
    dataset = Dataset.from_dict({"prompt": [f"{p} {i}" for i in range(4) for p in prompts]})
    args = MultiAgentRLHFConfig(
        output_dir=os.path.join(out_dir, "run"),
        num_agents=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=MAX_STEPS,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=SAVE_STEPS,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        reward_learning_rate=1e-3,
        reward_train_batch_size=4,
        report_to="none",
        seed=0,
        disable_tqdm=True,
    )
    steps = RecordSteps(sleep=1.0 if mode == "slow" else 0.0)
    trainer = MultiAgentRLHFTrainer(
        model=tiny_model_path(), reward_funcs=length_ratio, args=args, train_dataset=dataset, callbacks=[steps]
    )
    trainer.train(resume_from_checkpoint=True if mode == "resume" else None)

    weights = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    torch.save(weights, os.path.join(out_dir, "weights.pt"))
    torch.save(trainer.reward_model.state_dict(), os.path.join(out_dir, "reward_model.pt"))
    result = {
        "global_step": trainer.state.global_step,
        "steps": steps.steps,
        "reward_model_steps": len(trainer.reward_model_history),
    }
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
