"""Two agents, two turns, a checker in between: the second agent's answer should be 2-3x as long as the first's.

Turn 0: both agents answer the task independently. A deterministic checker then tells each agent what was wrong
("the second answer is too short: write less" to the writer, "... write more" to the editor); that feedback is
their prompt for turn 1. Every turn is scored by the same joint reward: 0 when the length ratio is in [2, 3], else
minus the distance to that band (at most -1). An episode ends at the first turn that passes
(`early_termination_threshold`), so passing at once (return 0) beats passing after feedback (return r_0 < 0). Each
agent is trained on both turns with group-relative advantages of the discounted return-to-go.

Run it:

    python examples/two-turn-checker.py --model tiny            # offline, a tiny model built in code: ~2.5 minutes
    python examples/two-turn-checker.py                         # Qwen/Qwen2.5-0.5B from the Hub

Every flag is listed by `--help`. At the end it evaluates with greedy decoding and prints each turn's reward.
"""

import os
from dataclasses import dataclass, field

from datasets import Dataset
from trl import TrlParser

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.testing import tiny_model_path


@dataclass
class ScriptArguments:
    model: str = field(
        default="Qwen/Qwen2.5-0.5B",
        metadata={"help": "Model id or local path for both agents; 'tiny' builds a tiny offline model."},
    )
    output_dir: str = field(default="./two_turn_checker_output", metadata={"help": "Where models are saved."})
    epochs: float | None = field(default=None, metadata={"help": "Training epochs (3; 40 for the tiny model)."})
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many steps (overrides epochs)."})
    learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate (5e-5; 3e-3 for the tiny model, which starts random)."}
    )
    num_generations: int = field(default=8, metadata={"help": "Trajectories per prompt (G)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Tokens per turn (128; 24 for tiny)."})
    discount: float = field(default=1.0, metadata={"help": "Discount of turn 1's reward in turn 0's return."})
    seed: int = field(default=42, metadata={"help": "Random seed."})
    wandb: bool = field(default=False, metadata={"help": "Log to Weights & Biases."})


DEFAULTS = {
    "tiny": dict(epochs=40, learning_rate=3e-3, max_new_tokens=24),
    "pretrained": dict(epochs=3, learning_rate=5e-5, max_new_tokens=128),
}

TASKS = [
    "Describe a city in the clouds:",
    "Invent a new holiday:",
    "Write a bedtime story for a dragon:",
    "Tell a joke about dinosaurs:",
    "Invent a new type of fruit:",
    "Design a playground on Mars:",
]
LOW, HIGH = 2.0, 3.0  # the band for len(second) / len(first)


def miss(first: str, second: str) -> float:
    """How far the length ratio is from the band [LOW, HIGH]; negative when too short, positive when too long."""
    ratio = len(second) / max(len(first), 1)
    return ratio - LOW if ratio < LOW else ratio - HIGH if ratio > HIGH else 0.0


def check_reward(completions1: list[str], completions2: list[str]) -> list[float]:
    """0 when the ratio is in the band, else minus the distance to it, at most -1."""
    return [-min(abs(miss(a, b)), 1.0) for a, b in zip(completions1, completions2)]


def checker_feedback(row: dict, histories: list[list[str]], turn: int) -> list[str]:
    """The transition: each agent's next prompt is the task plus what the checker found in this turn's answers."""
    off = miss(histories[0][-1], histories[1][-1])
    verdict = "too short" if off < 0 else "too long"
    writer, editor = ("write less", "write more") if off < 0 else ("write more", "write less")
    return [
        f"{row['prompt']}\nChecker: the second answer is {verdict}; {writer}.",
        f"{row['prompt']}\nChecker: your answer is {verdict}; {editor}.",
    ]


def main(script_args: ScriptArguments) -> MultiAgentGRPOTrainer:
    model = tiny_model_path() if script_args.model == "tiny" else script_args.model
    setting = {
        key: value if getattr(script_args, key) is None else getattr(script_args, key)
        for key, value in DEFAULTS["tiny" if script_args.model == "tiny" else "pretrained"].items()
    }
    if script_args.wandb:
        os.environ.setdefault("WANDB_PROJECT", "multiagent-trl")
    args = MultiAgentGRPOConfig(
        output_dir=script_args.output_dir,
        num_agents=2,
        num_turns=2,
        discount=script_args.discount,
        early_termination_threshold=-1e-6,  # the check passed: the episode ends
        num_train_epochs=setting["epochs"],
        max_steps=script_args.max_steps,
        learning_rate=setting["learning_rate"],
        num_generations=script_args.num_generations,
        per_device_train_batch_size=2 * script_args.num_generations,  # two tasks per step
        max_completion_length=setting["max_new_tokens"],
        eval_do_sample=False,  # evaluate the greedy policy: one trajectory per task is enough
        num_generations_eval=1,
        per_device_eval_batch_size=len(TASKS),
        logging_steps=5,
        seed=script_args.seed,
        report_to=["wandb"] if script_args.wandb else "none",
        save_strategy="no",
    )
    tasks = Dataset.from_dict({"prompt": TASKS})
    trainer = MultiAgentGRPOTrainer(
        model=model,
        reward_funcs=check_reward,
        args=args,
        train_dataset=tasks,
        eval_dataset=tasks,
        external_transition=checker_feedback,
    )
    trainer.train()
    metrics = trainer.evaluate()
    print({key: round(value, 3) for key, value in metrics.items() if "reward" in key and "/std" not in key})
    trainer.save_model(f"{script_args.output_dir}/models")
    return trainer


if __name__ == "__main__":
    (script_args,) = TrlParser(ScriptArguments).parse_args_and_config()
    main(script_args)
