"""Trains a 2-agent tiny team under `accelerate launch --num_processes 2` and writes what the test checks.

Each rank writes `rank{r}.json`: a fingerprint of every agent's weights before and after training, and every joint
sample its reward function scored (the row id carried in the prompt, with each agent's prompt), so the test can check
that ranks agree, that training moved the weights, and that no tuple paired one row's completion with another row's.
"""

import json
import sys

from datasets import Dataset
from peft import LoraConfig

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.testing import end_launched_process, tiny_model_path


def main(out_dir: str, kind: str) -> None:
    """`kind`: "full" (separate models), "lora" (adapters on one base) or "multiturn" (separate models, two turns)."""
    seen = []

    def tagged(prompts, completions, row_id, **kwargs):
        for (p0, p1), rid in zip(prompts, row_id):
            seen.append([p0, p1, rid])
        # "multiturn": even rows end after turn 1 (their mean passes the threshold), so the ranks' trees differ
        bonus = [10.0 * (kind == "multiturn" and rid % 2 == 0) for rid in row_id]
        return [len(b) / (1 + len(a)) + extra for (a, b), extra in zip(completions, bonus)]

    dataset = Dataset.from_dict({"prompt": [f"Row {i}: tell a story." for i in range(8)], "row_id": list(range(8))})
    args = MultiAgentGRPOConfig(
        output_dir=f"{out_dir}/run",
        num_agents=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        seed=0,
        # "multiturn": a second turn for the nodes whose first turn scored at most 1 on average
        num_turns=2 if kind == "multiturn" else 1,
        early_termination_threshold=1.0 if kind == "multiturn" else None,
    )
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=tagged,
        args=args,
        train_dataset=dataset,
        formatters=[lambda row: "A " + row["prompt"], lambda row: "B " + row["prompt"]],
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if kind == "lora" else None,
        external_transition=lambda row, histories, turn: [f"{agent} Row {row['row_id']}: again." for agent in "AB"],
    )
    team = trainer.model

    def fingerprint():
        return [[float(p.detach().double().sum()) for p in team.agent_parameters(i)] for i in range(2)]

    initial = fingerprint()
    trainer.train()
    accelerator = trainer.accelerator
    with open(f"{out_dir}/rank{accelerator.process_index}.json", "w") as f:
        result = {"initial": initial, "fingerprint": fingerprint(), "seen": seen, "world": accelerator.num_processes}
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_launched_process()
