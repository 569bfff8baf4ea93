"""A CoMLRL 1.4.3 training script in CoMLRL's own style, for the parity check of the CoMLRL layer.

It uses every `MAGRPOConfig` field and `MAGRPOTrainer` argument that CoMLRL's downstream projects use
(`parallel_training`, `agent_devices`, `train_batch_size`, `eval_num_samples`, `eval_batch_size`, `top_k=None`,
`advantage_mode`, `agent_model` + `num_agents`, `model_config`, `wandb_config`, `eval_logger`/`eval_aggregator`,
a multi-turn `external_transition`, formatters, a reward with `batch_items=`), then what scripts do after
construction: `trainer.verbose = ...`, `train(checkpoint_dir=..., checkpoint_interval=...,
checkpoint_total_limit=...)`,
`evaluate(num_eval_samples=...)` and `save_model(...)`.

Under CoMLRL (it needs the `bench` extra, `pip install comlrl==1.4.3`; a tiny local model, no download):

    WANDB_MODE=offline python benchmarks/comlrl_script.py --model "$(python -c \
        'from multiagent_trl.testing import tiny_model_path; print(tiny_model_path())')" --output-dir /tmp/comlrl-run

`tests/test_comlrl_script.py` runs this same file under multiagent_trl with only the two import lines below changed.
"""

import argparse
import json
import os

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.utils.reward_processor import RewardProcessors
from datasets import Dataset

PROBLEMS = [
    {"prompt": "Name a color:", "target": 12},
    {"prompt": "Name an animal:", "target": 16},
    {"prompt": "Name a city:", "target": 10},
    {"prompt": "Name a fruit:", "target": 14},
]


def formatter_a(item, external_prompts=None):
    return external_prompts if external_prompts is not None else f"Writer: {item['prompt']}"


def formatter_b(item, external_prompts=None):
    return external_prompts if external_prompts is not None else f"Editor: {item['prompt']}"


def together_length_reward(completions1, completions2, *, batch_items):
    """Both agents' answers together should be about `target` characters long."""
    return [
        1.0 - min(abs(len(a) + len(b) - row["target"]) / row["target"], 1.0)
        for a, b, row in zip(completions1, completions2, batch_items)
    ]


def length_feedback(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    total = sum(len(c) for c in agent_completions)
    return [f"{prompt} (together you wrote {total} characters; agent {i}, revise:)" for i in range(num_agents)]


def eval_logger(agent_completions_turns, batch_items, prompts):
    metrics = []
    for j, row in enumerate(batch_items):
        entry = {}
        for t in range(len(agent_completions_turns[0][j])):
            total = sum(len(agent_completions_turns[i][j][t]) for i in range(len(agent_completions_turns)))
            entry[f"turn_{t + 1}/length_error"] = abs(total - row["target"])
        metrics.append(entry)
    return metrics


def eval_aggregator(metrics, num_turns=1):
    keys = sorted({k for m in metrics for k in m})
    return {k: sum(m[k] for m in metrics if k in m) / sum(1 for m in metrics if k in m) for k in keys}


def main(model_name, output_dir, advantage_mode="rloo"):
    dataset = Dataset.from_list(PROBLEMS)
    args = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=1e-4,
        logging_steps=1,
        num_agents=2,
        parallel_training="mp",
        agent_devices=["cpu", "cpu"],
        num_generations=2,
        max_new_tokens=8,
        temperature=0.8,
        top_p=0.9,
        top_k=None,
        num_turns=2,
        discount=0.9,
        early_termination_threshold=None,
        eval_interval=2,
        eval_num_samples=2,
        eval_batch_size=1,
        rollout_buffer_size=2,
        train_batch_size=1,
        advantage_normalization=False,
        advantage_mode=advantage_mode,
    )
    trainer = MAGRPOTrainer(
        agent_model=model_name,
        num_agents=2,
        model_config={"torch_dtype": "float32", "special_tokens": {"pad_token": "<|pad|>"}},
        train_dataset=dataset,
        eval_dataset=dataset,
        reward_func=together_length_reward,
        reward_processor=RewardProcessors.scale(factor=10.0),
        formatters=[formatter_a, formatter_b],
        external_transition=length_feedback,
        wandb_config={
            "project": "comlrl-parity",
            "name": "script",
            "dir": os.path.join(output_dir, "wandb"),
            "tags": ["parity"],
            "config_sections": {"dataset": {"name": "names", "type": "toy"}, "output": {"verbose": False}},
        },
        eval_logger=eval_logger,
        eval_aggregator=eval_aggregator,
        args=args,
    )
    trainer.verbose = False
    trainer.train(
        checkpoint_dir=os.path.join(output_dir, "checkpoints"), checkpoint_interval=1, checkpoint_total_limit=1
    )
    metrics = trainer.evaluate(num_eval_samples=2)
    trainer.save_model(os.path.join(output_dir, "final"))
    return trainer, metrics


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="A model id or local path (e.g. the tiny test model).")
    parser.add_argument("--output-dir", default="comlrl_script_output")
    parser.add_argument("--advantage-mode", default="rloo", choices=["mean", "raw", "max", "rloo"])
    cli = parser.parse_args()
    _, result = main(cli.model, cli.output_dir, cli.advantage_mode)
    print(json.dumps({k: float(v) for k, v in sorted(result.items()) if isinstance(v, (int, float))}, indent=1))
