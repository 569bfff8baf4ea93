"""Two agents with different tools answer one question together: a calculator and a lookup table.

Each row is a two-part question ("What is 2 plus 3? And what is the capital of France?"). Agent 0 gets the arithmetic
part and one tool, `add`; agent 1 gets the geography part and another, `capital`. Each agent runs TRL's own
tool-calling loop with its own tools (the tool results are in its conversation and out of its loss), and the joint
reward is the fraction of the two parts whose final answer is right: the team is rewarded only together.

Run it:

    python examples/tool-team.py --model tiny                 # offline: a tiny model fine-tuned in code to call tools
    python examples/tool-team.py --model Qwen/Qwen2.5-0.5B-Instruct --bf16 true
    accelerate launch --multi_gpu --num_processes 2 examples/tool-team.py --model tiny

Every `MultiAgentGRPOConfig` field (so every `GRPOConfig` field, `--max_tool_calling_iterations` included) is a flag,
and a key of a YAML file given with `--config`.
"""

import random
from dataclasses import dataclass, field

from datasets import Dataset
from trl import TrlParser

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.tools.testing import CALCULATOR_QUESTIONS, CAPITALS, LOOKUP_QUESTIONS, add, capital


@dataclass
class ScriptArguments:
    """The script's own flags, beside those of `MultiAgentGRPOConfig`."""

    model: str = field(
        default="tiny",
        metadata={"help": "Model id or path for both agents; 'tiny' builds the offline tiny tool-calling model."},
    )
    num_questions: int = field(default=64, metadata={"help": "Rows in the training set (a real model draws them)."})


def questions(tiny: bool, count: int, seed: int = 0) -> Dataset:
    """Rows with each agent's question and the expected answers. The tiny model knows only its training questions."""
    rng = random.Random(seed)
    rows = {"calculation": [], "a": [], "b": [], "country": []}
    for k in range(count):
        if tiny:
            (_, sums), (_, country) = CALCULATOR_QUESTIONS[k % 2], LOOKUP_QUESTIONS[k % 2]
            a, b, country = sums["a"], sums["b"], country["country"]
        else:
            a, b, country = rng.randint(1, 99), rng.randint(1, 99), rng.choice(sorted(CAPITALS))
        rows["a"].append(a)
        rows["b"].append(b)
        rows["country"].append(country)
        rows["calculation"].append(f"What is {a} plus {b}?")
    return Dataset.from_dict({k: v for k, v in rows.items() if v})


def calculator_prompt(row: dict) -> list[dict]:
    return [{"role": "user", "content": row["calculation"]}]


def lookup_prompt(row: dict) -> list[dict]:
    return [{"role": "user", "content": f"What is the capital of {row['country']}?"}]


def final_answer(conversation: list[dict]) -> str:
    """The last assistant message's text (after the tool calls and their results)."""
    answers = [m["content"] for m in conversation if m["role"] == "assistant" and m.get("content")]
    return answers[-1].strip() if answers else ""


def both_right(prompts, completions, a, b, country, **kwargs) -> list[float]:
    """TRL style: `completions[j]` is (agent 0's conversation, agent 1's). 0.5 for each right part."""
    rewards = []
    for (calculation, lookup), x, y, c in zip(completions, a, b, country):
        rewards.append(0.5 * (final_answer(calculation) == str(x + y)) + 0.5 * (final_answer(lookup) == CAPITALS[c]))
    return rewards


def main() -> None:
    parser = TrlParser((ScriptArguments, MultiAgentGRPOConfig))
    script, args = parser.parse_args_and_config(
        fail_with_unknown_args=True,
    )
    tiny = script.model == "tiny"
    if tiny:
        from multiagent_trl.tools.testing import tiny_tool_caller_path

        script.model = tiny_tool_caller_path()
    args.num_agents = 2
    trainer = MultiAgentGRPOTrainer(
        model=script.model,
        reward_funcs=both_right,
        args=args,
        train_dataset=questions(tiny, script.num_questions, args.seed),
        formatters=[calculator_prompt, lookup_prompt],
        tools=[[add], [capital]],  # one list per agent: agent 0 calculates, agent 1 looks up
    )
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()
