"""Trains a 2-agent tiny team for `MAX_STEPS` steps, saving every `SAVE_STEPS`, for tests/test_kill_resume.py.

Usage: `python tests/scripts/kill_resume.py OUT_DIR MODE [KIND]`. The trainer's output dir is `OUT_DIR/run`; a run
that ends writes the team's final weights to `OUT_DIR/weights.pt`, and its global step and the steps it ran to
`OUT_DIR/result.json`. KIND: `full` (separate models, the default) or `lora` (one LoRA adapter per agent). MODE:

- `straight`: train from scratch.
- `slow`: train from scratch, sleeping after every step, so the test has time to kill it mid-run.
- `resume`: `train(resume_from_checkpoint=True)` in `OUT_DIR/run`.
- `die-in-save`: train from scratch; during the second checkpoint save, after the agents are written and before the
  optimizer is, the process sends itself SIGKILL.
"""

import json
import os
import signal
import sys
import time

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.testing import tiny_model_path

MAX_STEPS = 6
SAVE_STEPS = 2


def ratio(completions1, completions2):
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


class RecordSteps(TrainerCallback):
    """Records the steps this process ran; with `sleep`, pauses after each one."""

    def __init__(self, sleep: float):
        self.sleep, self.steps = sleep, []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)
        time.sleep(self.sleep)


def main(out_dir: str, mode: str, kind: str = "full") -> None:
    torch.set_num_threads(1)  # the matrices are tiny: more threads only contend, and slow the run down a lot
    prompts = ["Describe a city in the clouds:", "Invent a new holiday:", "Tell a joke about dinosaurs:"]
    dataset = Dataset.from_dict({"prompt": [f"{p} {i}" for i in range(4) for p in prompts]})
    args = MultiAgentGRPOConfig(
        output_dir=os.path.join(out_dir, "run"),
        num_agents=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=MAX_STEPS,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="steps",
        save_steps=SAVE_STEPS,
        seed=0,
        disable_tqdm=True,
    )
    steps = RecordSteps(sleep=1.0 if mode == "slow" else 0.0)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=ratio,
        args=args,
        train_dataset=dataset,
        callbacks=[steps],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if kind == "lora" else None,
    )
    if mode == "die-in-save":
        save_optimizer_and_scheduler = trainer._save_optimizer_and_scheduler
        saves = []

        def dies_in_second_save(output_dir):
            saves.append(output_dir)
            if len(saves) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            save_optimizer_and_scheduler(output_dir)

        trainer._save_optimizer_and_scheduler = dies_in_second_save

    trainer.train(resume_from_checkpoint=True if mode == "resume" else None)

    weights = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}  # every agent's (and base)
    torch.save(weights, os.path.join(out_dir, "weights.pt"))
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({"global_step": trainer.state.global_step, "steps": steps.steps}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
