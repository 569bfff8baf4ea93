"""Two agents, one joint reward: the second agent's answer should be 2-3x as long as the first's.

Both agents receive the same instruction and generate independently (agent 2 never sees agent 1's answer). The
reward is 1.0 when the second completion has 2 to 3 times the characters of the first, and decays exponentially
with the distance to that band. It does not judge story quality. This is the CoMLRL tutorial, run on
multiagent_trl with only its import lines changed.

Run it:

    python examples/story-len-ratio.py --model tiny              # offline, a tiny model built in code: ~2 minutes
    python examples/story-len-ratio.py --model tiny --lora       # one LoRA adapter per agent on one shared base
    python examples/story-len-ratio.py                           # Qwen/Qwen2.5-0.5B from the Hub
    python examples/story-len-ratio.py --wandb --wandb-project my-project
    accelerate launch --multi_gpu --num_processes 2 examples/story-len-ratio.py

Every flag (also `--config run.yaml`) is listed by `--help`.
"""

import math
import os
from dataclasses import dataclass, field
from functools import partial

from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import TrlParser

from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors
from multiagent_trl.testing import tiny_model_path


@dataclass
class ScriptArguments:
    model: str = field(
        default="Qwen/Qwen2.5-0.5B",
        metadata={"help": "Model id or local path for both agents; 'tiny' builds a tiny offline model."},
    )
    output_dir: str = field(default="./magrpo_multi_reward_output", metadata={"help": "Where models are saved."})
    epochs: float | None = field(default=None, metadata={"help": "Training epochs (3; 40 for the tiny model)."})
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many steps (overrides epochs)."})
    learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate (5e-5; 3e-3 for the tiny model, which starts random)."}
    )
    num_generations: int = field(default=8, metadata={"help": "Completions per agent per prompt."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Completion length (128; 32 for tiny)."})
    logging_steps: int | None = field(default=None, metadata={"help": "Log every this many steps (10; 5 tiny)."})
    seed: int = field(default=42, metadata={"help": "Random seed."})
    lora: bool = field(default=False, metadata={"help": "Train one LoRA adapter per agent on one shared base."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (alpha / r scales the update)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        metadata={"help": "Modules that get an adapter (never lm_head)."},
    )
    wandb: bool = field(default=False, metadata={"help": "Log to Weights & Biases."})
    wandb_project: str | None = field(default=None, metadata={"help": "W&B project (optional)."})
    wandb_entity: str | None = field(default=None, metadata={"help": "W&B entity (optional)."})


# Defaults per model: a randomly initialised tiny model needs a far larger learning rate and more epochs; LoRA
# adapters take a larger learning rate than full fine-tuning.
DEFAULTS = {
    ("tiny", False): dict(epochs=40, learning_rate=3e-3, max_new_tokens=32, logging_steps=5),
    ("tiny", True): dict(epochs=40, learning_rate=2e-2, max_new_tokens=32, logging_steps=5),
    ("pretrained", False): dict(epochs=3, learning_rate=5e-5, max_new_tokens=128, logging_steps=10),
    ("pretrained", True): dict(epochs=3, learning_rate=2e-4, max_new_tokens=128, logging_steps=10),
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


def main(script_args: ScriptArguments) -> MAGRPOTrainer:
    model_name = tiny_model_path() if script_args.model == "tiny" else script_args.model
    defaults = DEFAULTS["tiny" if script_args.model == "tiny" else "pretrained", script_args.lora]
    setting = {
        key: getattr(script_args, key) if getattr(script_args, key) is not None else value
        for key, value in defaults.items()
    }

    # Dataset: creative prompts, the same for both agents.
    train_dataset = Dataset.from_dict({"prompt": TRAIN_PROMPTS})

    # Agents: one tokenizer, a separate model instance per agent (or, with --lora, one base and two adapters).
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    agents, peft_config = None, None
    if script_args.lora:
        peft_config = LoraConfig(
            r=script_args.lora_r,
            lora_alpha=script_args.lora_alpha,
            lora_dropout=script_args.lora_dropout,
            target_modules=script_args.lora_target_modules,
        )
    else:
        agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)]

    if script_args.wandb:
        for key, env in (("wandb_project", "WANDB_PROJECT"), ("wandb_entity", "WANDB_ENTITY")):
            if getattr(script_args, key):
                os.environ[env] = getattr(script_args, key)

    config = MAGRPOConfig(
        output_dir=script_args.output_dir,
        num_train_epochs=setting["epochs"],
        max_steps=script_args.max_steps,
        agent_learning_rate=setting["learning_rate"],
        logging_steps=setting["logging_steps"],
        num_generations=script_args.num_generations,
        num_turns=1,
        max_new_tokens=setting["max_new_tokens"],
        seed=script_args.seed,
        report_to=["wandb"] if script_args.wandb else "none",
        save_strategy="no",
    )

    # RewardProcessors.scale multiplies the task reward by 100; group normalization of the advantages largely
    # cancels a positive scale, so it is not a 100x stronger policy gradient.
    configured_reward_func = partial(proper_length_ratio_reward, target_min=2, target_max=3)
    trainer = MAGRPOTrainer(
        agents=agents,
        model=model_name if script_args.lora else None,
        peft_config=peft_config,
        reward_func=configured_reward_func,
        reward_processor=RewardProcessors.scale(factor=100.0),
        args=config,
        train_dataset=train_dataset,
        tokenizer=tokenizer,
    )
    trainer.train()
    trainer.save_model(f"{script_args.output_dir}/models")
    return trainer


if __name__ == "__main__":
    (script_args,) = TrlParser(ScriptArguments).parse_args_and_config()
    main(script_args)
