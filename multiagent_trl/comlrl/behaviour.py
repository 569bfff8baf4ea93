"""What every CoMLRL trainer does the same way, whatever its family: `train()`'s checkpoint arguments,
`evaluate(num_eval_samples)`, CoMLRL's metric names in `log`, `verbose`, `wandb_config`, `model_config`, building
without a training dataset, and the centralized setup; `docs/comlrl-users.md` describes each."""

from __future__ import annotations

import copy
import inspect
import numbers
import os
from typing import Any

from datasets import Dataset
from peft import PeftConfig
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl.trainer.utils import RepeatSampler

from ..actor_critic.value_model import split_value_model
from ..rewards.centralized import CentralizedCollaboration, TaggedCentralizedComparatorAdapter, check_adapter
from ..team.loading import load_agents, load_processing_classes
from ..team.snapshots import RunSnapshots

MODEL_CONFIG_KEYS = ("torch_dtype", "dtype", "attn_implementation", "model_kwargs", "special_tokens", "name")
WANDB_CONFIG_KEYS = ("project", "entity", "name", "run_name", "dir", "tags", "config_sections", "id", "resume")
TRAIN_KWARGS = ("trial", "ignore_keys_for_eval")


class CoMLRLBehaviour(RunSnapshots):
    """Mixin listed before the core trainer among a CoMLRL trainer's bases."""

    # Training logs CoMLRL's `turn_k/reward_mean` beside TRL's `turn_k/reward`; with one turn, these keys are copied
    # from `reward` (`comlrl_log_modes`: the modes that do it; the actor-critic port logs them in evaluation too).
    one_turn_keys: tuple[str, ...] = ("turn_1/reward", "turn_1/expected_return")
    comlrl_log_modes: tuple[str, ...] = ("train",)
    # Set by `centralize` in centralized mode: the roles' task; evaluation then splits the one writer's outputs.
    centralized_collaboration: CentralizedCollaboration | None = None
    # The centralized mode's adapter, set before the core's `__init__` by the families that take one.
    centralized_comparator_adapter = None
    config_family: type = object  # what `args` must be (a family's base config)

    def comlrl_args(self, args):
        """`args`, or the class's default config when `None`; a config that is not a `config_family` raises."""
        return expected_config(args, self.default_config_cls, self.config_family, type(self).__name__)

    def centralize(self, args, roles: dict, kwargs: dict):
        """CoMLRL's centralized setup (`args.collaboration_mode`), before the core's `__init__`. `roles` holds the
        trainer's `agents`, `tokenizer`, `reward_func`, `formatters` and `num_agents` (the role count, kept as
        `num_roles`). Centralized, they are rewritten in place for one model (from `agents`, or `model=` in `kwargs`,
        alone or in a list of one) whose formatter is the roles' joint prompt and whose reward is the roles' joint
        reward (`centralized_collaboration`, with `centralized_comparator_adapter`), and the core's copy of `args`
        with one agent is returned (the user's keeps the role count); else `args` is returned as it is."""
        self.num_roles = roles["num_agents"]
        if getattr(args, "collaboration_mode", None) != "centralized":
            return args
        if self.num_roles != args.num_agents:
            raise ValueError(
                f"`num_agents={self.num_roles}` (the number of roles) must equal `args.num_agents={args.num_agents}`."
            )
        agents = one_of("model", kwargs.pop("model", None), "agents", roles["agents"])
        agents, tokenizer = one_actor(agents, roles["tokenizer"], self.num_roles, self.algorithm_name)
        reward_func = one_of("reward_funcs", kwargs.pop("reward_funcs", None), "reward_func", roles["reward_func"])
        if not callable(reward_func):
            raise ValueError(f"`reward_func` must be one callable (the roles' joint reward), got {reward_func!r}.")
        adapter = self.centralized_comparator_adapter
        team = CentralizedCollaboration(adapter, roles["formatters"], reward_func, self.num_roles)
        self.centralized_collaboration = team
        roles.update(agents=agents, tokenizer=tokenizer, reward_func=team, formatters=team.build_prompt, num_agents=1)
        core_args = copy.copy(args)
        core_args.num_agents = 1
        return core_args

    def comlrl_setup(self, args, wandb_config: dict | None, eval_dataset, train_dataset, kwargs: dict):
        """Before the core's `__init__`: `wandb_config` onto `args` (its callback into `kwargs`), no evaluation
        without `eval_dataset` (as CoMLRL), and a stand-in for a missing `train_dataset` (TRL refuses none at
        construction; `comlrl_finish` puts `None` back). Returns the training dataset to build with."""
        self.wandb_config = wandb_config
        if wandb_config is not None:
            callback = apply_wandb_config(args, wandb_config)
            if callback is not None:
                kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
        if eval_dataset is None:
            args.eval_strategy, args.eval_on_start = "no", False
        self._comlrl_stand_in = train_dataset is None
        return Dataset.from_dict({"prompt": []}) if train_dataset is None else train_dataset

    def comlrl_finish(self) -> None:
        """After the core's `__init__`: `train_dataset=None` restored, `config_sections.output.verbose` applied."""
        if self._comlrl_stand_in:
            self.train_dataset = None
        sections = (self.wandb_config or {}).get("config_sections") or {}
        output = sections.get("output") if isinstance(sections, dict) else None
        if isinstance(output, dict) and "verbose" in output:
            self.verbose = bool(output["verbose"])

    @property
    def verbose(self) -> bool:
        """Progress bars (`True`) or plain log lines (`False`); CoMLRL's `trainer.verbose`."""
        return not self.args.disable_tqdm

    @verbose.setter
    def verbose(self, value: bool) -> None:
        self.args.disable_tqdm = not value
        old, new = (PrinterCallback, ProgressCallback) if value else (ProgressCallback, PrinterCallback)
        self.remove_callback(old)
        if not any(isinstance(cb, new) for cb in self.callback_handler.callbacks):
            self.add_callback(new)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        if mode in self.comlrl_log_modes:
            metrics = self._metrics[mode]
            if self.args.num_turns == 1 and metrics.get("reward"):  # one turn: its reward is the return
                for key in self.one_turn_keys:
                    metrics[key] = list(metrics["reward"])
            for key in [k for k in metrics if k.startswith("turn_") and k.endswith("/reward")]:
                metrics[f"{key}_mean"] = list(metrics[key])
        super().log(logs, start_time)

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs,
    ):
        """Train, with CoMLRL's checkpoint arguments (a checkpoint after every `checkpoint_interval` epochs in
        `checkpoint_dir`, at most `checkpoint_total_limit` kept) mapped onto Trainer's checkpoints."""
        if self.train_dataset is None:
            raise ValueError(
                "Training requires a dataset, and this trainer was built without one (as CoMLRL allows, to "
                "evaluate). Training needs a `train_dataset`: pass `train_dataset=` to the trainer."
            )
        for name, value, optional in (
            ("checkpoint_interval", checkpoint_interval, False),
            ("checkpoint_total_limit", checkpoint_total_limit, True),
        ):
            if optional and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                allowed = "a positive integer or None" if optional else "a positive integer (epochs)"
                raise ValueError(f"`{name}` must be {allowed}, got {value!r}.")
        unknown = set(kwargs) - set(TRAIN_KWARGS)
        if unknown:
            raise TypeError(
                f"train() got {sorted(unknown)}: CoMLRL passed these to generation; here generation settings are "
                "config fields (`temperature`, `top_p`, `top_k`, `generation_kwargs={...}`)."
            )
        if checkpoint_dir is not None or checkpoint_interval != 1 or checkpoint_total_limit is not None:
            self.checkpoint_every_epochs(checkpoint_interval, checkpoint_dir, checkpoint_total_limit)
        return super().train(resume_from_checkpoint=self.take_pending_checkpoint(resume_from_checkpoint), **kwargs)

    def evaluate(self, num_eval_samples: int | None = None, eval_dataset=None, ignore_keys=None, **kwargs):
        """Evaluate `num_eval_samples` rows (default `args.eval_num_samples`; the first rows of the evaluation
        dataset), one trajectory each through all turns, as CoMLRL does. Returns the metrics, keyed `eval_...`:
        TRL's, `eval_turn_k/reward_mean`, `eval_turn_k/expected_return` and the family's own (`eval_aggregator`'s,
        `metrics_callback`'s); `{}` without an evaluation dataset."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            return {}
        count = self.args.eval_num_samples if num_eval_samples is None else int(num_eval_samples)
        if hasattr(dataset, "select"):  # CoMLRL evaluates at least one row
            dataset = dataset.select(range(min(max(count, 1), len(dataset))))
        return super().evaluate(eval_dataset=dataset, ignore_keys=ignore_keys, **kwargs)

    def _get_eval_sampler(self, eval_dataset):
        # CoMLRL evaluates the rows in dataset order (its logger's lists follow it); TRL's sampler shuffles them.
        return RepeatSampler(eval_dataset, mini_repeat_count=self.num_generations_eval, shuffle=False)


def decay_every_parameter(trainer, model) -> list[str]:
    """`Trainer.get_decay_parameter_names` as CoMLRL's AdamW has it: every parameter decays (Trainer exempts biases
    and norms)."""
    return [name for name, _ in model.named_parameters()]


def expected_config(args, default: type, family: type, trainer: str):
    """The config a CoMLRL trainer (named `trainer`) runs: `args`, or `default()` when `None`; anything but a
    `family` config raises, naming both."""
    args = args if args is not None else default()
    if not isinstance(args, family):
        raise TypeError(f"`args` is a {type(args).__name__}; {trainer} needs a {family.__name__}.")
    return args


def with_keywords(init, *names: str) -> inspect.Signature:
    """`init`'s signature with keyword-only `names` (default `None`) before its `**kwargs`: the signature of a
    CoMLRL trainer whose `__init__(*args, <names>, **kwargs)` passes the rest on to `init`."""
    params = list(inspect.signature(init).parameters.values())
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in names]
    return inspect.Signature([*params[:-1], *extra, params[-1]])


def one_of(name: str, value, alias: str, alias_value):
    """The argument given under its TRL `name` or its CoMLRL `alias`; both given raise."""
    if value is not None and alias_value is not None:
        raise ValueError(f"Pass either `{name}` or its CoMLRL name `{alias}`, not both.")
    return value if value is not None else alias_value


def one_actor(agents, tokenizer, num_roles: int, algorithm: str = "MADPO"):
    """Centralized mode's one model and tokenizer, each unwrapped from a list of one (CoMLRL accepts those)."""
    if isinstance(agents, (list, tuple)):
        if len(agents) != 1:
            raise ValueError(
                f"Centralized {algorithm} trains exactly one actor model (it writes all {num_roles} roles); got "
                f"{len(agents)} in `agents`."
            )
        agents = agents[0]
    if isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != 1:
            raise ValueError(f"Centralized {algorithm} has one actor model and one tokenizer; got {len(tokenizer)}.")
        tokenizer = tokenizer[0]
    return agents, tokenizer


def comparator_adapter(adapter):
    """CoMLRL's `centralized_comparator_adapter` (MADPO, MARLHF): `None` is the tagged one; checked in either mode,
    used in centralized mode."""
    adapter = TaggedCentralizedComparatorAdapter() if adapter is None else adapter
    check_adapter(adapter, "centralized_comparator_adapter")
    return adapter


def as_one_actor(config, finish) -> None:
    """Run `finish()` (a config's mapping onto the core and the core's checks); with `collaboration_mode=
    "centralized"` one actor writes every role, so it runs with `num_agents=1` (everything read per agent is the one
    model's) and `num_agents` is then the role count again, as in CoMLRL. The comparator fields of the iterative
    configs get CoMLRL's centralized checks."""
    if config.collaboration_mode != "centralized":
        return finish()
    if getattr(config, "comparator_centralized_agent_index", 0) != 0:
        raise ValueError(
            "Centralized collaboration has one actor: `comparator_centralized_agent_index` must be 0, got "
            f"{config.comparator_centralized_agent_index}."
        )
    if hasattr(config, "comparator_generation_mode"):
        config.comparator_generation_mode = "centralized"
    roles = config.num_agents
    if roles is None or roles < 1:
        raise ValueError(f"`num_agents` (the number of roles) must be at least 1, got {roles}.")
    config.num_agents = 1
    try:
        finish()
    finally:
        config.num_agents = roles


def agent_sources(agent_model, agents, num_agents: int):
    """CoMLRL's `agent_model` / `agents` / `num_agents`, as the core's `model`."""
    if agent_model is None:
        return list(agents) if isinstance(agents, (list, tuple)) else agents
    if not isinstance(agent_model, (str, os.PathLike)):
        raise ValueError("`agent_model` must be a model id or path (N homogeneous agents); pass models as `agents=`.")
    if num_agents < 1:
        raise ValueError(f"`num_agents` must be at least 1, got {num_agents}.")
    if agents is None:
        return str(agent_model)
    if not isinstance(agents, (list, tuple)) or len(agents) != num_agents:
        raise ValueError(f"`agents` must be a list of `num_agents` ({num_agents}) models when `agent_model` is given.")
    if any(a != agent_model for a in agents):
        raise ValueError(f"`agent_model` and `agents` conflict: {agent_model!r} != {list(agents)!r}; pass one.")
    return list(agents)


def apply_model_config(model, processing_class, model_config, args, kwargs: dict):
    """CoMLRL's `model_config`: loading kwargs for agents given by name, and special tokens for every tokenizer
    (with each agent's embeddings resized to its tokenizer)."""
    config = dict(model_config or {})
    unknown = set(config) - set(MODEL_CONFIG_KEYS)
    if unknown:
        raise ValueError(
            f"`model_config` has {sorted(unknown)}, which no step here reads. Accepted: {list(MODEL_CONFIG_KEYS)}; "
            "put other `from_pretrained` arguments under `model_config['model_kwargs']`."
        )
    init_kwargs = dict(args.model_init_kwargs or {})
    nested = config.get("model_kwargs") or {}
    if not isinstance(nested, dict):
        raise ValueError(f"`model_config['model_kwargs']` must be a dict, got {type(nested).__name__}.")
    init_kwargs.update({k: v for k, v in nested.items() if k not in ("torch_dtype", "dtype")})
    dtype = nested.get("torch_dtype") or nested.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    if dtype is not None:
        init_kwargs["dtype"] = dtype
    if "attn_implementation" in config:
        init_kwargs.setdefault("attn_implementation", config["attn_implementation"])
    args.model_init_kwargs = init_kwargs or None
    special_tokens = config.get("special_tokens") or {}
    if not special_tokens:
        return model, processing_class
    # Special tokens change the vocabulary: load the agents and tokenizers here, add the tokens, resize embeddings.
    shared_base = isinstance(kwargs.get("peft_config"), PeftConfig) and isinstance(model, (str, os.PathLike))
    given = model if isinstance(model, list) else [model]
    # An agent given with a value head (the actor-critic family) stays whole: the LM inside is resized in place.
    inner = [split_value_model(agent)[0] for agent in given]
    inner_model = inner if isinstance(model, list) else inner[0]
    models = load_agents(inner_model, args, kwargs.get("quantization_config"), copies=not shared_base)
    tokenizers = load_processing_classes(processing_class, models, args)
    for tok in {id(t): t for t in tokenizers}.values():
        tok.add_special_tokens(special_tokens)
    for agent, tok in zip(models, tokenizers, strict=True):
        if agent.get_input_embeddings().num_embeddings < len(tok):
            agent.resize_token_embeddings(len(tok))
    if shared_base:
        return models[0], tokenizers[0]
    if len(given) == len(models):
        models = [agent if lm is loaded else loaded for agent, lm, loaded in zip(given, inner, models)]
    return models, tokenizers if len({id(t) for t in tokenizers}) > 1 else tokenizers[0]


class WandbSections(TrainerCallback):
    """Record CoMLRL's `wandb_config["config_sections"]` (and the CoMLRL run summary) in the wandb run's config."""

    def __init__(self, sections: dict[str, Any]):
        self.sections = sections

    def on_train_begin(self, args, state, control, **kwargs):
        import wandb  # only with report_to="wandb", which installs it

        if wandb.run is not None and state.is_world_process_zero:
            wandb.run.config.update(self.sections, allow_val_change=True)


def apply_wandb_config(args, wandb_config: dict[str, Any]) -> TrainerCallback | None:
    """CoMLRL's `wandb_config` onto `report_to="wandb"` and wandb's environment variables; a callback that records
    `config_sections` in the run's config."""
    if not isinstance(wandb_config, dict):
        raise TypeError(f"`wandb_config` must be a dict, got {type(wandb_config).__name__}.")
    unknown = set(wandb_config) - set(WANDB_CONFIG_KEYS)
    if unknown:
        raise ValueError(f"`wandb_config` has {sorted(unknown)}; accepted keys: {list(WANDB_CONFIG_KEYS)}.")
    env = {"project": "WANDB_PROJECT", "entity": "WANDB_ENTITY", "dir": "WANDB_DIR", "id": "WANDB_RUN_ID"}
    for key, name in env.items():
        if wandb_config.get(key):
            os.environ[name] = str(wandb_config[key])
    if wandb_config.get("dir"):
        os.makedirs(wandb_config["dir"], exist_ok=True)
    if wandb_config.get("resume"):
        os.environ["WANDB_RESUME"] = "allow" if wandb_config["resume"] is True else str(wandb_config["resume"])
    if wandb_config.get("tags"):
        os.environ["WANDB_TAGS"] = ",".join(wandb_config["tags"])
    name = wandb_config.get("name") or wandb_config.get("run_name")
    if name:
        args.run_name = name
    args.report_to = ["wandb"]
    sections = wandb_config.get("config_sections")
    if sections is None:
        return None
    if not isinstance(sections, dict):
        raise TypeError(f"`wandb_config['config_sections']` must be a dict, got {type(sections).__name__}.")
    return WandbSections(dict(sections))
