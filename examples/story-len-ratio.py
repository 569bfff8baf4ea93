"""Two agents, one joint reward: the second agent's answer should be 2-3x as long as the first's.

Both agents receive the same instruction and generate independently (agent 2 never sees agent 1's answer). The
reward is 1.0 when the second completion has 2 to 3 times the characters of the first, and decays exponentially
with the distance to that band. It does not judge story quality. This is the CoMLRL tutorial, run on
multiagent_trl with only its import lines changed.

Run it:

    python examples/story-len-ratio.py --model tiny              # offline, a tiny model built in code: ~2 minutes
    python examples/story-len-ratio.py --model tiny --lora       # one LoRA adapter per agent on one shared base
    python examples/story-len-ratio.py                           # Qwen/Qwen2.5-0.5B from the Hub
    python examples/story-len-ratio.py --model tiny --beta 0.04 --gradient_accumulation_steps 2
    python examples/story-len-ratio.py --config examples/configs/tiny.yaml --learning_rate 1e-3
    python examples/story-len-ratio.py --wandb --wandb-project my-project
    accelerate launch --multi_gpu --num_processes 2 examples/story-len-ratio.py

Every field of `MAGRPOConfig` (so every `GRPOConfig` and `TrainingArguments` field), of TRL's `ModelConfig`
(`--use_peft`, `--lora_r`, `--lora_alpha`, `--lora_target_modules`, `--dtype`, ...) and of `ScriptArguments` below is
a flag (`--help` lists them; `--max-steps` and `--max_steps` both work) and a key of a YAML file given with
`--config`. The settings per model live in `examples/configs/`: without `--config`, the script reads `tiny.yaml`
(`--model tiny`) or `pretrained.yaml` (any other model), or their `-lora` twins with `--lora` / `--use_peft`.
Flags win over the YAML file.
"""

import argparse
import math
import os
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import ModelConfig, TrlParser, get_peft_config

from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors
from multiagent_trl.testing import tiny_model_path

CONFIGS = Path(__file__).resolve().parent / "configs"


@dataclass
class ScriptArguments:
    """The script's own flags, beside those of `MAGRPOConfig` and TRL's `ModelConfig`."""

    model: str | None = field(
        default=None,
        metadata={
            "help": "Model id or local path for both agents (short for --model_name_or_path); 'tiny' builds a tiny "
            "offline model. Without --config it also picks the config file: tiny.yaml or pretrained.yaml."
        },
    )
    lora: bool = field(
        default=False,
        metadata={"help": "Train one LoRA adapter per agent on one shared base (short for --use_peft)."},
    )
    wandb: bool = field(default=False, metadata={"help": "Log to Weights & Biases (short for --report_to wandb)."})
    wandb_project: str | None = field(default=None, metadata={"help": "W&B project (optional)."})
    wandb_entity: str | None = field(default=None, metadata={"help": "W&B entity (optional)."})


# GRPO fields that MAGRPOConfig overwrites from their CoMLRL twins after parsing (see its docstring). A value the
# user gave for one of them must not vanish silently.
COMLRL_TWINS = {
    "learning_rate": "agent_learning_rate",
    "max_completion_length": "max_new_tokens",
    "scale_rewards": "advantage_normalization",
    "per_device_train_batch_size": "rollout_buffer_size",
    "beta": "reference_kl_coef",
    "eval_steps": "eval_interval",
    "eval_strategy": "eval_interval",
    "per_device_eval_batch_size": "eval_batch_size",
    "steps_per_generation": "train_batch_size",
    "num_generations_eval": "eval_interval",
    "eval_on_start": "eval_interval",
    "advantage_baseline": "advantage_mode",
}

TRAIN_PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Explain how teleportation might work:",
    "Tell a joke about dinosaurs:",
    "Describe a world without electricity:",
    "Create a superhero with a unique power:",
    "Write a scene where the moon talks:",
    "Invent a new type of fruit:",
    "Design a playground on Mars:",
]


def proper_length_ratio_reward(completions1, completions2, target_min=2.0, target_max=3.0):
    """1.0 when len(second) / len(first) is in [target_min, target_max], else exp(-distance); 0 if first is empty."""
    rewards = []
    for c1, c2 in zip(completions1, completions2):
        len1, len2 = len(c1), len(c2)
        if len1 == 0:
            rewards.append(0.0)
            continue
        ratio = len2 / len1
        if target_min <= ratio <= target_max:
            reward = 1.0
        else:
            distance = target_min - ratio if ratio < target_min else ratio - target_max
            reward = math.exp(-distance)
        rewards.append(float(reward))
    return rewards


# ------------------------------------------------------------------------------------------------ command line


def with_default_config(argv: list[str]) -> list[str]:
    """`argv` with `--config examples/configs/<tiny|pretrained>[-lora].yaml` in front, unless it names a config."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--model")
    pre.add_argument("--model_name_or_path", "--model-name-or-path")
    for flag in ("--lora", "--use_peft", "--use-peft"):
        pre.add_argument(flag, nargs="?", const="true", default="false")
    known, _ = pre.parse_known_args(argv)
    if known.model and known.model_name_or_path and known.model != known.model_name_or_path:
        raise ValueError(
            f"--model {known.model} and --model_name_or_path {known.model_name_or_path} disagree: give only one."
        )
    if known.config:
        return argv
    model = known.model or known.model_name_or_path
    lora = any(str(value).lower() in ("true", "yes", "t", "y", "1") for value in (known.lora, known.use_peft))
    name = ("tiny" if model == "tiny" else "pretrained") + ("-lora" if lora else "")
    return ["--config", str(CONFIGS / f"{name}.yaml"), *argv]


def flags_and_yaml_keys(argv: list[str]) -> tuple[set[str], set[str]]:
    """The field names set by flags on the command line, and those set in the `--config` file."""
    import yaml

    flags = {arg[2:].split("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")} - {"config"}
    with open(argv[argv.index("--config") + 1]) as file:
        return flags, set(yaml.safe_load(file) or {})


def _one_for_all(value):
    """A per-agent setting given once (`--max_completion_length 7` parses to `[7]`), as the config keeps it."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, MAGRPOConfig, ModelConfig]:
    """Parse the flags and the YAML config into the script's arguments, a `MAGRPOConfig` and TRL's `ModelConfig`."""
    argv = with_default_config(sys.argv[1:] if argv is None else list(argv))
    parser = TrlParser((ScriptArguments, MAGRPOConfig, ModelConfig))
    script_args, config, model_args = parser.parse_args_and_config(argv)
    # The values as given (YAML then flags), before MAGRPOConfig.__post_init__ maps CoMLRL fields onto GRPO ones.
    config_at = argv.index("--config")
    raw, _ = parser.parse_known_args(argv[:config_at] + argv[config_at + 2 :])
    flags, yaml_keys = flags_and_yaml_keys(argv)
    for name, twin in COMLRL_TWINS.items():
        # A flag of the CoMLRL twin may override the GRPO name's YAML value; anything else that is lost is an error.
        given = name in flags or (name in yaml_keys and twin not in flags)
        if given and _one_for_all(getattr(raw, name)) != getattr(config, name):
            raise ValueError(
                f"`{name}={getattr(raw, name)!r}` was replaced by {getattr(config, name)!r}: MAGRPOConfig sets "
                f"`{name}` from its CoMLRL field `{twin}`, which wins. Set `{twin}` instead of `{name}`."
            )
    if model_args.load_in_4bit or model_args.load_in_8bit:
        raise ValueError("--load_in_4bit / --load_in_8bit are not supported by this example: remove them.")
    if script_args.wandb:
        config.report_to = ["wandb"]
        for key, env in (("wandb_project", "WANDB_PROJECT"), ("wandb_entity", "WANDB_ENTITY")):
            if getattr(script_args, key):
                os.environ[env] = getattr(script_args, key)
    model_args.use_peft = model_args.use_peft or script_args.lora
    model_args.model_name_or_path = script_args.model or model_args.model_name_or_path
    return script_args, config, model_args


# --------------------------------------------------------------------------------------------------- the tutorial


def main(script_args: ScriptArguments, config: MAGRPOConfig, model_args: ModelConfig) -> MAGRPOTrainer:
    """The tutorial: dataset, agents and trainer from the parsed settings; trains, saves, returns the trainer."""
    model_name = model_args.model_name_or_path
    model_name = tiny_model_path() if model_name == "tiny" else model_name
    output_dir = config.output_dir

    # Dataset: creative prompts, the same for both agents.
    train_dataset = Dataset.from_dict({"prompt": TRAIN_PROMPTS})

    # Agents: one tokenizer, a separate model instance per agent (or, with --lora, one base and two adapters).
    load = dict(
        revision=model_args.model_revision, dtype=model_args.dtype, attn_implementation=model_args.attn_implementation
    )
    tokenizer = AutoTokenizer.from_pretrained(model_name, revision=model_args.model_revision)
    peft_config = get_peft_config(model_args)  # None unless --use_peft / --lora
    agents, base = None, None
    if peft_config is None:
        agents = [AutoModelForCausalLM.from_pretrained(model_name, **load) for _ in range(config.num_agents)]
    else:
        base = AutoModelForCausalLM.from_pretrained(model_name, **load)

    # RewardProcessors.scale multiplies the task reward by 100; group normalization of the advantages largely
    # cancels a positive scale, so it is not a 100x stronger policy gradient.
    configured_reward_func = partial(proper_length_ratio_reward, target_min=2, target_max=3)
    trainer = MAGRPOTrainer(
        agents=agents,
        model=base,
        peft_config=peft_config,
        reward_func=configured_reward_func,
        reward_processor=RewardProcessors.scale(factor=100.0),
        args=config,
        train_dataset=train_dataset,
        tokenizer=tokenizer,
    )
    trainer.train()
    trainer.save_model(f"{output_dir}/models")
    return trainer


if __name__ == "__main__":
    main(*parse_args())
