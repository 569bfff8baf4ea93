"""A two-turn CoMLRL 1.4.3 script in the style of CoMLRL's own task projects (its Minecraft project): a feedback
transition, and a reward that reads element [0] of each agent's list and returns one value, as CoMLRL calls it once
per joint sample.

Under CoMLRL (the `bench` extra, `pip install comlrl==1.4.3`; a tiny local model, no download):

    WANDB_MODE=offline python benchmarks/comlrl_two_turn_script.py --model "$(python -c \
        'from multiagent_trl.testing import tiny_model_path; print(tiny_model_path())')"

`tests/test_comlrl_script.py` runs this same file under both libraries, with only the import lines changed, and
compares how often each called the reward and the transition.
"""

import argparse
import json

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from datasets import Dataset

CALLS = {"reward": 0, "transition": 0}


def length_reward(completions1, completions2):
    """One joint sample: the two answers together should be about 12 characters long."""
    CALLS["reward"] += 1
    total = len(completions1[0]) + len(completions2[0])
    return [1.0 - min(abs(total - 12) / 12, 1.0)]


def feedback(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    CALLS["transition"] += 1
    total = sum(len(c) for c in agent_completions)
    return [
        f"{prompt} You wrote {total} characters together; aim for 12. Agent {i}, again:" for i in range(num_agents)
    ]


def main(model_name):
    CALLS.update(reward=0, transition=0)
    dataset = Dataset.from_list([{"prompt": "Name a color:"}, {"prompt": "Name an animal:"}])
    args = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=1e-4,
        num_agents=2,
        num_generations=2,
        max_new_tokens=8,
        num_turns=2,
        early_termination_threshold=None,
        rollout_buffer_size=2,
        eval_interval=0,
    )
    trainer = MAGRPOTrainer(
        agent_model=model_name,
        num_agents=2,
        model_config={"torch_dtype": "float32"},
        train_dataset=dataset,
        reward_func=length_reward,
        external_transition=feedback,
        args=args,
    )
    trainer.train()
    return trainer, dict(CALLS)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="A model id or local path (e.g. the tiny test model).")
    cli = parser.parse_args()
    print(json.dumps(main(cli.model)[1]))
