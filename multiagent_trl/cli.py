"""`multiagent-trl`: train a team from the command line, as `trl grpo` trains one model; every family has its command.

    multiagent-trl grpo --model_name_or_path Qwen/Qwen2.5-0.5B --num_agents 2 \
        --dataset_name trl-lib/DeepMath-103K --reward_funcs my_lib.rewards.joint --output_dir team
    multiagent-trl grpo --config team.yaml --agent_models Qwen/Qwen2.5-0.5B HuggingFaceTB/SmolLM2-135M
    multiagent-trl magrpo --model_name_or_path Qwen/Qwen2.5-0.5B --agent_learning_rate 5e-6 --max_new_tokens 128 ...
    accelerate launch --num_processes 2 -m multiagent_trl.cli grpo ...  # or $(which multiagent-trl)

`grpo` parses TRL's `grpo` script flags (`GRPOScriptArguments`: `--dataset_name`, `--dataset_config`,
`--dataset_train_split`, `--reward_funcs`, `--reward_model_name_or_path`, ...), every `MultiAgentGRPOConfig` field
(`--num_agents`, `--joint_mode`, `--num_turns`, per-agent lists such as `--temperature 0.7 1.0`), TRL's `ModelConfig`
(`--use_peft`, `--lora_r`, `--dtype`, ...: with `--use_peft` each agent trains its own LoRA adapter) and
`DatasetMixtureConfig`, with the `TeamArguments` below; `magrpo` parses `MAGRPOConfig` instead (CoMLRL's names:
`--agent_learning_rate`, `--max_new_tokens`, ...) and trains with `MAGRPOTrainer`. A YAML `--config` gives any of
them; flags win. The other native families parse their own config the same way: `dpo` (`MultiAgentDPOConfig`),
`rlhf`, `iterative-dpo`, `iterative-rlhf`, `actor-critic` and `actor-critic-rlhf` (with `--critic_model`, the
critics' model; default: each agent's). Training saves `output_dir/agent_{i}/`; `--push_to_hub` pushes the team at
the end (see `hub`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trl import DatasetMixtureConfig, ModelConfig, TrlParser
from trl.scripts.grpo import GRPOScriptArguments

from . import hub, preference
from .actor_critic import ActorCriticConfig, ActorCriticTrainer
from .config import MultiAgentGRPOConfig
from .trainer import MultiAgentGRPOTrainer

if TYPE_CHECKING:
    from .comlrl.reinforce import MAGRPOConfig

# The native families' commands; `magrpo` is CoMLRL's MAGRPO, from the `comlrl` layer, which only that command loads.
NATIVE_COMMANDS = {
    "grpo": (MultiAgentGRPOConfig, MultiAgentGRPOTrainer),
    "dpo": (preference.MultiAgentDPOConfig, preference.MultiAgentDPOTrainer),
    "rlhf": (preference.MultiAgentRLHFConfig, preference.MultiAgentRLHFTrainer),
    "iterative-dpo": (preference.MultiAgentIterativeDPOConfig, preference.MultiAgentIterativeDPOTrainer),
    "iterative-rlhf": (preference.MultiAgentIterativeRLHFConfig, preference.MultiAgentIterativeRLHFTrainer),
    "actor-critic": (ActorCriticConfig, ActorCriticTrainer),
    "actor-critic-rlhf": (preference.ActorCriticRLHFConfig, preference.ActorCriticRLHFTrainer),
}
COMMANDS = (*NATIVE_COMMANDS, "magrpo")


def command_classes(command: str) -> tuple[type[MultiAgentGRPOConfig], type[MultiAgentGRPOTrainer]]:
    """The config and trainer classes of `command` (one of `COMMANDS`)."""
    if command == "magrpo":
        from .comlrl.reinforce import MAGRPOConfig, MAGRPOTrainer

        return MAGRPOConfig, MAGRPOTrainer
    return NATIVE_COMMANDS[command]


@dataclass
class TeamArguments(GRPOScriptArguments):
    """TRL's `grpo` script arguments, plus what a team needs beyond one model.

    Args:
        agent_models (`list[str]`, *optional*):
            One model id or path per agent (they may differ in size and architecture); without it every agent
            starts from `--model_name_or_path`.
        formatters (`list[str]`, *optional*):
            Dotted import paths of `formatter(row) -> prompt` functions: one for all agents or one per agent.
        external_transition (`str`, *optional*):
            Dotted import path of the `(row, histories, turn) -> prompts` function that `--num_turns > 1` needs.
        hub_single_repo (`bool`, *optional*, defaults to `False`):
            With `--push_to_hub`: one repo with `agent_i/` folders instead of one repo per agent.
        critic_model (`str`, *optional*):
            The `actor-critic` and `actor-critic-rlhf` commands' critics (a model id or path, every critic starting
            from it); without it each critic starts from its agent's model.
    """

    agent_models: list[str] | None = field(
        default=None,
        metadata={"help": "One model id or path per agent; default: every agent starts from --model_name_or_path."},
    )
    formatters: list[str] | None = field(
        default=None,
        metadata={"help": "Dotted import paths of `formatter(row) -> prompt` functions: one for all, or one each."},
    )
    external_transition: str | None = field(
        default=None,
        metadata={"help": "Dotted import path of the `(row, histories, turn)` transition that --num_turns > 1 needs."},
    )
    hub_single_repo: bool = field(
        default=False,
        metadata={"help": "With --push_to_hub: one repo with agent_i/ folders instead of one repo per agent."},
    )
    critic_model: str | None = field(
        default=None,
        metadata={"help": "actor-critic commands: the critics' model id or path; default: each agent's model."},
    )


def import_object(path: str, flag: str) -> Callable:
    """The object at the dotted import path `path` (`my_module.my_func`), importable from the working directory.

    Errors name `flag`, the command-line flag that gave `path`.
    """
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{flag} {path!r}: expected a dotted import path such as 'my_module.my_function'.")
    if os.getcwd() not in sys.path:  # as `trl grpo` does: a module next to the command is importable
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{flag} {path!r}: cannot import module {module_name!r} ({err}).") from err
    if not hasattr(module, name):
        raise ValueError(f"{flag} {path!r}: module {module_name!r} has no attribute {name!r}.")
    return getattr(module, name)


def builtin_rewards() -> dict[str, Callable]:
    """TRL's reward functions by the names `trl grpo` accepts (the same overlong settings as its script)."""
    from trl.rewards import (
        accuracy_reward,
        get_soft_overlong_punishment,
        reasoning_accuracy_reward,
        think_format_reward,
    )

    return {
        "accuracy_reward": accuracy_reward,
        "reasoning_accuracy_reward": reasoning_accuracy_reward,
        "think_format_reward": think_format_reward,
        "get_soft_overlong_punishment": get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256),
    }


def per_agent_reward(func: Callable, num_agents: int) -> Callable:
    """A one-model TRL reward function as a team reward: each agent's completion scored alone, one value per agent.

    The returned function takes the team's joint samples (`completions[j]` a tuple of N completions, and
    `completion_ids` likewise) and returns, for each joint sample, the N agents' rewards (a row), which the trainer
    credits to each agent. Where `func` returns `None` (TRL's "does not apply", e.g. `accuracy_reward` without a
    parsable solution), a batch cannot hold per-agent rows: each joint sample gets the mean of its agents' rewards
    instead (`None` if none applies). With one agent, `func` itself is returned.
    """
    if num_agents == 1:
        return func

    def team_reward(prompts, completions, **kwargs):
        ids = kwargs.pop("completion_ids", None)
        per_agent = []
        for i in range(num_agents):
            agent_kwargs = dict(kwargs, completions=[c[i] for c in completions])
            if ids is not None:
                agent_kwargs["completion_ids"] = [c[i] for c in ids]
            per_agent.append(func(prompts=[p[i] if isinstance(p, tuple) else p for p in prompts], **agent_kwargs))
        rows = [list(row) for row in zip(*per_agent)]
        if all(v is not None for row in rows for v in row):
            return rows
        scored = [[v for v in row if v is not None] for row in rows]
        return [sum(values) / len(values) if values else None for values in scored]

    team_reward.__name__ = getattr(func, "__name__", type(func).__name__)
    return team_reward


def reward_functions(args: TeamArguments, num_agents: int) -> list:
    """The reward functions named by `--reward_model_name_or_path` and `--reward_funcs`, as `trl grpo` reads them."""
    registry = builtin_rewards()
    funcs: list = [args.reward_model_name_or_path] if args.reward_model_name_or_path else []
    for name in args.reward_funcs or []:
        if name in registry:
            funcs.append(per_agent_reward(registry[name], num_agents))
        elif "." in name:
            funcs.append(import_object(name, "--reward_funcs"))
        else:
            raise ValueError(
                f"--reward_funcs {name!r} is neither one of TRL's reward functions ({', '.join(registry)}) nor a "
                "dotted import path such as 'my_module.my_reward'."
            )
    if not funcs:
        raise ValueError("Give a joint reward: --reward_funcs my_module.my_reward (or --reward_model_name_or_path).")
    return funcs


def make_parser(command: str) -> TrlParser:
    """The parser of `multiagent-trl <command>`: TRL's parser over the script, config, model and dataset classes."""
    config_class = command_classes(command)[0]
    dataclass_types = (TeamArguments, config_class, ModelConfig, DatasetMixtureConfig)
    return TrlParser(dataclass_types, prog=f"multiagent-trl {command}")


def check_comlrl_twins(parser: TrlParser, argv: list[str], config: MAGRPOConfig) -> None:
    """Refuse a GRPO name given to `magrpo` (a flag, or a key of the `--config` file) whose value `MAGRPOConfig`
    replaced from its CoMLRL twin (`--learning_rate` with CoMLRL's default `agent_learning_rate`, ...)."""
    flags = {arg[2:].split("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")}
    at = argv.index("--config") if "--config" in argv else len(argv)
    raw, _ = parser.parse_known_args(argv[:at] + argv[at + 2 :])  # the parser's defaults hold the file's values
    yaml_keys = set()
    if at < len(argv):
        import yaml

        with open(argv[at + 1]) as file:
            yaml_keys = set(yaml.safe_load(file) or {})
    from .comlrl.reinforce import COMLRL_TWINS

    for name, twin in COMLRL_TWINS.items():
        given = name in flags or (name in yaml_keys and twin not in flags)
        value = getattr(raw, name, None)
        value = value[0] if isinstance(value, list) and len(value) == 1 else value  # a per-agent value given once
        if given and value != getattr(config, name):
            raise ValueError(
                f"--{name} {value!r} was replaced by {getattr(config, name)!r}: `magrpo` (MAGRPOConfig) sets {name} "
                f"from CoMLRL's --{twin}. Give --{twin} instead (or use `grpo`, which takes TRL's names)."
            )


def parse_args(argv: list[str]) -> tuple[str, TeamArguments, MultiAgentGRPOConfig, ModelConfig, DatasetMixtureConfig]:
    """Parse `argv` (`[command, flags...]`, with an optional YAML `--config`) into the command and its settings."""
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"usage: multiagent-trl {{{','.join(COMMANDS)}}} [--help] [flags]")
    parser = make_parser(argv[0])
    script_args, config, model_args, dataset_args = parser.parse_args_and_config(argv[1:])
    if argv[0] == "magrpo":
        check_comlrl_twins(parser, argv[1:], config)
    if script_args.agent_models and model_args.model_name_or_path:
        raise ValueError("Give either --model_name_or_path (every agent) or --agent_models (one per agent), not both.")
    if not (script_args.agent_models or model_args.model_name_or_path):
        raise ValueError("Give the agents: --model_name_or_path (every agent) or --agent_models (one per agent).")
    if script_args.critic_model and not issubclass(command_classes(argv[0])[1], ActorCriticTrainer):
        raise ValueError(f"--critic_model is for the actor-critic commands; `{argv[0]}` trains no critic.")
    return argv[0], script_args, config, model_args, dataset_args


def is_saved_dataset(path: str) -> bool:
    """Whether `path` is a folder written by `datasets`' `save_to_disk` (a `Dataset` or a `DatasetDict`)."""
    from datasets import config

    names = (config.DATASET_STATE_JSON_FILENAME, config.DATASETDICT_JSON_FILENAME)
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, name)) for name in names)


def load_saved_dataset(path: str, script_args: TeamArguments):
    """A `save_to_disk` folder as a `DatasetDict` (a saved `Dataset` is the `--dataset_train_split` split), streamed
    with `--dataset_streaming`. `load_dataset` refuses such a folder, and `trl grpo` does not read one."""
    from datasets import Dataset, DatasetDict, IterableDatasetDict, load_from_disk

    if script_args.dataset_config is not None:
        raise ValueError(
            f"--dataset_config {script_args.dataset_config!r} names a configuration of a Hub dataset, but "
            f"--dataset_name {path!r} is a `save_to_disk` folder, which has none: drop --dataset_config."
        )
    dataset = load_from_disk(path)
    if isinstance(dataset, Dataset):
        dataset = DatasetDict({script_args.dataset_train_split: dataset})
    if script_args.dataset_streaming:
        dataset = IterableDatasetDict({split: data.to_iterable_dataset() for split, data in dataset.items()})
    return dataset


def load_datasets(script_args: TeamArguments, config: MultiAgentGRPOConfig, dataset_args: DatasetMixtureConfig):
    """The train and eval datasets, read as `trl grpo` reads them (`load_dataset(--dataset_name)` or a mixture); a
    `--dataset_name` folder written by `save_to_disk` is read with `load_from_disk`."""
    from datasets import load_dataset
    from trl import get_dataset

    if dataset_args.datasets:
        dataset = get_dataset(dataset_args)
    elif script_args.dataset_name and is_saved_dataset(script_args.dataset_name):
        dataset = load_saved_dataset(script_args.dataset_name, script_args)
    elif script_args.dataset_name:
        dataset = load_dataset(
            script_args.dataset_name, name=script_args.dataset_config, streaming=script_args.dataset_streaming
        )
    else:
        raise ValueError("Give a dataset: --dataset_name (a Hub id or a local folder) or --datasets in --config.")
    # A folder of one split has no test split: no evaluation then (CoMLRL's default `eval_interval` asks for one;
    # with `grpo --eval_strategy steps`, Trainer's error says that an eval dataset is missing).
    test_split = script_args.dataset_test_split
    eval_dataset = dataset[test_split] if config.eval_strategy != "no" and test_split in dataset else None
    return dataset[script_args.dataset_train_split], eval_dataset


def build_trainer(
    command: str,
    script_args: TeamArguments,
    config: MultiAgentGRPOConfig,
    model_args: ModelConfig,
    dataset_args: DatasetMixtureConfig,
) -> MultiAgentGRPOTrainer:
    """The trainer of `command` from the parsed settings: agents, datasets, rewards, formatters and transition."""
    from trl import get_peft_config, get_quantization_config

    config.model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": config.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(config.model_init_kwargs or {}),
    }
    model = script_args.agent_models or model_args.model_name_or_path
    num_agents = len(model) if isinstance(model, list) else (config.num_agents or 1)
    train_dataset, eval_dataset = load_datasets(script_args, config, dataset_args)
    formatters = None
    if script_args.formatters:
        formatters = [import_object(path, "--formatters") for path in script_args.formatters]
        formatters = formatters[0] if len(formatters) == 1 else formatters
    transition = None
    if script_args.external_transition:
        transition = import_object(script_args.external_transition, "--external_transition")
    kwargs = {}
    if command == "magrpo":
        kwargs["num_agents"] = num_agents  # MAGRPOTrainer's own argument (CoMLRL's), which sets the config's
    if script_args.critic_model:
        kwargs["critic_model"] = script_args.critic_model
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    return command_classes(command)[1](
        model=model,
        reward_funcs=reward_functions(script_args, num_agents),
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
        formatters=formatters,
        external_transition=transition,
        **kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    """Run `multiagent-trl` with `argv` (default: `sys.argv[1:]`): parse, train, save, and push if asked."""
    command, script_args, config, model_args, dataset_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    # Pushed once, at the end, one repo per agent: Trainer's own pushes (of the whole output_dir to one repo, at
    # every save) are turned off.
    push, config.push_to_hub = config.push_to_hub, False
    trainer = build_trainer(command, script_args, config, model_args, dataset_args)
    if push:  # a repo name the Hub refuses fails now, not after training
        hub.team_repo_names(hub.hub_base_name(config), trainer.num_agents, script_args.hub_single_repo)
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_model(config.output_dir)
    trainer.accelerator.print(f"Saved {trainer.num_agents} agents to {config.output_dir}/agent_*/.")
    if push:
        urls = trainer.push_to_hub(dataset_name=script_args.dataset_name, single_repo=script_args.hub_single_repo)
        trainer.accelerator.print("Pushed to the Hub: " + ", ".join(urls or []))
    trainer.end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
