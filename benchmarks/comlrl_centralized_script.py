"""A CoMLRL 1.4.3 centralized MAGRPO script: one model writes both roles from one joint prompt (CoMLRL's tagged
adapter), and the roles are scored with the reward a two-agent team would use.

Under CoMLRL (the `bench` extra, `pip install comlrl==1.4.3`; a tiny local model, no download):

    WANDB_MODE=offline python benchmarks/comlrl_centralized_script.py --output /tmp/centralized --model "$(python -c \
        'from multiagent_trl.testing import tiny_model_path; print(tiny_model_path())')"

`tests/test_centralized.py` runs this same file under both libraries, with only the import lines changed.
"""

import argparse
import json

from comlrl.trainers.preference import TaggedCentralizedComparatorAdapter
from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from datasets import Dataset

SEEN = {"reward_calls": 0, "parsed": [], "eval_layout": None}


class TaggedOrHalves:
    """The tagged protocol; a completion without tags (an untrained model's) is split into two halves instead."""

    def __init__(self):
        self.tagged = TaggedCentralizedComparatorAdapter()

    def build_prompt(self, batch_item, agent_prompts):
        return self.tagged.build_prompt(batch_item, agent_prompts)

    def parse_completion(self, completion, batch_item, num_agents):
        try:
            return self.tagged.parse_completion(completion, batch_item, num_agents)
        except ValueError:  # CentralizedComparatorParseError
            half = len(completion) // 2
            return [completion[:half], completion[half:]]


def length_reward(completions1, completions2, *, batch_items=None):
    """One joint sample: the two roles together should be about 12 characters long."""
    SEEN["reward_calls"] += 1
    SEEN["parsed"].append((completions1[0], completions2[0], batch_items[0]["topic"]))
    total = len(completions1[0]) + len(completions2[0])
    return [1.0 - min(abs(total - 12) / 12, 1.0)]


def eval_logger(agent_completions_turns, batch_items, prompts):
    SEEN["eval_layout"] = [[len(turns) for turns in role] for role in agent_completions_turns]  # [role][item] -> turns
    return [
        {"turn_1/total_length": float(sum(len(role[k][0]) for role in agent_completions_turns))}
        for k in range(len(batch_items))
    ]


def eval_aggregator(metrics, num_turns=1):
    return {"turn_1/total_length": sum(m["turn_1/total_length"] for m in metrics) / len(metrics)}


def formatters():
    return [lambda item: f"Name a {item['topic']}:", lambda item: f"Describe a {item['topic']} in two words:"]


def main(model_name, output_dir):
    SEEN.update(reward_calls=0, parsed=[], eval_layout=None)
    dataset = Dataset.from_list([{"topic": "color"}, {"topic": "animal"}])
    args = CentralizedMAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=1e-3,
        num_agents=2,
        num_generations=2,
        max_new_tokens=8,
        rollout_buffer_size=2,
        eval_interval=0,
        eval_num_samples=2,
    )
    trainer = CentralizedMAGRPOTrainer(
        centralized_adapter=TaggedOrHalves(),
        num_agents=2,
        agent_model=model_name,
        model_config={"torch_dtype": "float32"},
        train_dataset=dataset,
        eval_dataset=dataset,
        reward_func=length_reward,
        formatters=formatters(),
        eval_logger=eval_logger,
        eval_aggregator=eval_aggregator,
        args=args,
    )
    trainer.train()
    train_calls = SEEN["reward_calls"]
    trainer.evaluate()
    trainer.save_model(f"{output_dir}/final")
    return trainer, {"train_reward_calls": train_calls, "eval_layout": SEEN["eval_layout"], "parsed": SEEN["parsed"]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="A model id or local path (e.g. the tiny test model).")
    parser.add_argument("--output", required=True, help="Where the trained model goes (output/final/agent_0).")
    cli = parser.parse_args()
    print(json.dumps({k: v for k, v in main(cli.model, cli.output)[1].items() if k != "parsed"}))
