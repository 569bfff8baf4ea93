"""Two agents, two turns, a checker in between: the second agent's answer should be 2-3x as long as the first's.

Turn 1: both agents answer the task independently, G times (G = `num_generations`). A deterministic checker then
tells each agent what was wrong with each joint answer ("the second answer is too short: write less" to the writer,
"... write more" to the editor); that feedback is their prompt for turn 2, where they answer G times again (MAGRPO's
tree: G + G*G joint samples per task). Every turn is scored by the same joint reward: 0 when the length ratio is in
[2, 3], else minus the distance to that band (at most -1). A node whose G answers all pass
(`early_termination_threshold`) gets no second turn, so passing at once (return 0) beats passing after feedback
(return r_1 < 0). Each agent is trained on both turns, with advantages relative to the answers given to the same
prompt (a node's G samples).

Run it:

    python examples/two-turn-checker.py --model tiny            # offline, a tiny model built in code: ~6 minutes
    python examples/two-turn-checker.py                         # Qwen/Qwen2.5-0.5B from the Hub
    python examples/two-turn-checker.py --model tiny --num_turns 3 --discount 0.9
    accelerate launch --multi_gpu --num_processes 2 examples/two-turn-checker.py

Every field of `MultiAgentGRPOConfig`, of TRL's `ModelConfig` (`--use_peft`, `--lora_r`, ...) and of
`ScriptArguments` below is a flag (`--help` lists them) and a key of a YAML file given with `--config`. The settings
per model live in `examples/configs/`: without `--config`, the script reads `two-turn-checker-tiny.yaml`
(`--model tiny`) or `two-turn-checker-pretrained.yaml` (any other model). Flags win over the YAML file. At the end it
evaluates with greedy decoding and prints each turn's reward.
"""

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import ModelConfig, TrlParser, get_peft_config

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.testing import tiny_model_path

CONFIGS = Path(__file__).resolve().parent / "configs"


@dataclass
class ScriptArguments:
    """The script's own flags, beside those of `MultiAgentGRPOConfig` and TRL's `ModelConfig`."""

    model: str | None = field(
        default=None,
        metadata={
            "help": "Model id or local path for both agents (short for --model_name_or_path); 'tiny' builds a tiny "
            "offline model. Without --config it also picks the config file."
        },
    )
    wandb: bool = field(default=False, metadata={"help": "Log to Weights & Biases (short for --report_to wandb)."})


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


def with_default_config(argv: list[str]) -> list[str]:
    """`argv` with `--config examples/configs/two-turn-checker-<tiny|pretrained>.yaml` first, unless it names one."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--model")
    pre.add_argument("--model_name_or_path", "--model-name-or-path")
    known, _ = pre.parse_known_args(argv)
    if known.model and known.model_name_or_path and known.model != known.model_name_or_path:
        raise ValueError(
            f"--model {known.model} and --model_name_or_path {known.model_name_or_path} disagree: give only one."
        )
    if known.config:
        return argv
    name = "tiny" if (known.model or known.model_name_or_path) == "tiny" else "pretrained"
    return ["--config", str(CONFIGS / f"two-turn-checker-{name}.yaml"), *argv]


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, MultiAgentGRPOConfig, ModelConfig]:
    """Parse the flags and the YAML config into the script's arguments, the trainer's config and TRL's ModelConfig."""
    argv = with_default_config(sys.argv[1:] if argv is None else list(argv))
    parser = TrlParser((ScriptArguments, MultiAgentGRPOConfig, ModelConfig))
    script_args, args, model_args = parser.parse_args_and_config(argv)
    if args.num_agents != 2:
        raise ValueError(f"`num_agents={args.num_agents}`: the checker compares two answers; set `--num_agents 2`.")
    if model_args.load_in_4bit or model_args.load_in_8bit:
        raise ValueError("--load_in_4bit / --load_in_8bit are not supported by this example: remove them.")
    if script_args.wandb:
        args.report_to = ["wandb"]
        os.environ.setdefault("WANDB_PROJECT", "multiagent-trl")
    model_args.model_name_or_path = script_args.model or model_args.model_name_or_path
    return script_args, args, model_args


def main(script_args: ScriptArguments, args: MultiAgentGRPOConfig, model_args: ModelConfig) -> MultiAgentGRPOTrainer:
    """Train the writer and the editor, evaluate them greedily, save them; returns the trainer."""
    name = model_args.model_name_or_path
    name = tiny_model_path() if name == "tiny" else name
    load = dict(
        revision=model_args.model_revision, dtype=model_args.dtype, attn_implementation=model_args.attn_implementation
    )
    peft_config = get_peft_config(model_args)  # None unless --use_peft
    if peft_config is None:  # a separate model per agent
        model = [AutoModelForCausalLM.from_pretrained(name, **load) for _ in range(args.num_agents)]
    else:  # one base, one LoRA adapter per agent
        model = AutoModelForCausalLM.from_pretrained(name, **load)
    tasks = Dataset.from_dict({"prompt": TASKS})
    trainer = MultiAgentGRPOTrainer(
        model=model,
        reward_funcs=check_reward,
        args=args,
        train_dataset=tasks,
        eval_dataset=tasks,
        peft_config=peft_config,
        external_transition=checker_feedback,
    )
    trainer.train()
    metrics = trainer.evaluate()
    print({key: round(value, 3) for key, value in metrics.items() if "reward" in key and "/std" not in key})
    trainer.save_model(f"{args.output_dir}/models")
    return trainer


if __name__ == "__main__":
    main(*parse_args())
