"""`MultiAgentGRPOConfig`: every `GRPOConfig` field, applied to each agent, plus the team's own fields."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import is_torch_bf16_gpu_available
from trl import GRPOConfig

from .rollout.tree import SHAPES as ROLLOUT_SHAPES
from .rollout.tree import tree_completions
from .team.arguments import AGENT_SETTINGS
from .team.placement import check_devices, resolve_devices

JOINT_MODES = ("aligned", "cross")
GENERATION_MODES = ("batched", "per_agent")
ADVANTAGE_BASELINES = ("mean", "none", "max", "leave_one_out")


def check_finite_settings(config: Any) -> None:
    """Raise a `ValueError` naming the first field of the dataclass `config` that holds a NaN or an infinity (a float,
    or a list of them: a per-agent setting).

    Every numeric setting of every config is checked, TRL's own (`learning_rate`, `beta`, `epsilon`, ...) included:
    none means anything when it is not finite, and a NaN passes every `<`/`>` range check (it compares False) to turn
    every weight it reaches into NaN, while Trainer's logged loss filters it out. `None` is the way to say "no value".

    >>> check_finite_settings(MultiAgentGRPOConfig(output_dir="out", report_to="none", temperature=[0.7, 1.0]))
    >>> MultiAgentGRPOConfig(output_dir="out", learning_rate=float("nan"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `learning_rate` must be a finite number, got nan: ...
    """
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        value = getattr(config, f.name, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ValueError(
                f"`{f.name}` must be a finite number, got {value!r}: NaN and infinity are not settings (use None "
                "where a field takes no value)."
            )


def annotation_parts(annotation: Any) -> set[str]:
    """The types a dataclass field's annotation unites, by name (`"int | None"`, `Optional[int]` and `int | None`
    give `{"int", "None"}`): a string under `from __future__ import annotations`, or the type itself."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = f"{text[len('Optional[') : -1]} | None"
    return {part.strip() for part in text.split("|")}


def declared_type(config_class: type, name: str) -> Any:
    """The annotation of field `name` as the first class of `config_class`'s MRO that declares it has it. Not
    `dataclasses.Field.type`: transformers' `HfArgumentParser` rewrites that in place for every later reader (`str |
    bool` becomes `bool`, so a parsed command line would make `include_num_input_tokens_seen="no"` read as a flag)."""
    for cls in config_class.__mro__:
        annotations = inspect.get_annotations(cls)
        if name in annotations:
            return annotations[name]
    return None


def whole_number_field(annotation: Any) -> bool:
    """Whether a field annotated `annotation` holds whole numbers only: `int`, a per-agent `list[int]`, or either
    of them or `None`."""
    parts = annotation_parts(annotation)
    return bool(parts & {"int", "list[int]"}) and parts <= {"int", "list[int]", "None"}


def check_whole_settings(config: Any) -> None:
    """Raise a `ValueError` naming the first whole-number field of the dataclass `config` (`whole_number_field`) that
    holds a fraction; a float of whole value (`2.0`) becomes the int. A count, a size or an index that is not whole
    would otherwise reach `range()`, a slice or a sampler only in `train()`, as a `TypeError` that names no setting.

    >>> MultiAgentGRPOConfig(output_dir="out", report_to="none", num_generations=2.0).num_generations
    2
    >>> MultiAgentGRPOConfig(output_dir="out", steps_per_generation=1.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `steps_per_generation` must be a whole number, got 1.5.
    """
    for name in checked_fields(type(config))["whole"]:
        value = getattr(config, name, None)
        whole = whole_number(name, value)
        if whole is not value:
            setattr(config, name, whole)


def check_flag_settings(config: Any) -> None:
    """Raise a `ValueError` naming the first field of the dataclass `config` annotated `bool` (or `bool | None`) that
    holds a string: every non-empty string is true, so `reference_free="False"` would read as True."""
    for name in checked_fields(type(config))["flag"]:
        value = getattr(config, name, None)
        if isinstance(value, str):
            raise ValueError(f"`{name}` is a flag: pass True or False, got the string {value!r}.")


@functools.cache
def checked_fields(config_class: type) -> dict[str, tuple[str, ...]]:
    """The init fields of the dataclass `config_class` that the value checks read, by their declared type: `"whole"`
    (`whole_number_field`) and `"flag"` (`bool`, or `bool | None`). Once per class: the checks run at the start of
    every `__post_init__` of a config's chain, and reading every field's declaration took about 10 ms a pass."""
    kinds = {f.name: declared_type(config_class, f.name) for f in dataclasses.fields(config_class) if f.init}
    return {
        "whole": tuple(name for name, kind in kinds.items() if whole_number_field(kind)),
        "flag": tuple(name for name, kind in kinds.items() if annotation_parts(kind) in ({"bool"}, {"bool", "None"})),
    }


def check_field_values(config: Any) -> None:
    """What every config checks first, before a field is compared or mapped: `check_finite_settings`,
    `check_whole_settings` and `check_flag_settings`."""
    check_finite_settings(config)
    check_whole_settings(config)
    check_flag_settings(config)


def whole_number(name: str, value: Any) -> Any:
    """`value` (of the setting `name`: a number, a per-agent list of them, or anything else, returned as it is) with
    each float of whole value as the int; a fraction raises a `ValueError` naming `name`."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not any(isinstance(v, float) for v in values):
        return value
    if any(isinstance(v, float) and not v.is_integer() for v in values):
        raise ValueError(f"`{name}` must be a whole number, got {value!r}.")
    values = [int(v) if isinstance(v, float) else v for v in values]
    return values if isinstance(value, (list, tuple)) else values[0]


# Ranges of settings that TRL and transformers take without a check: out of range, the sampling settings fail at the
# first `generate` inside `train()` without naming the setting (or, `top_p` above 1, are silently 1), a negative
# learning rate fails in the optimizer, a negative `beta` or `epsilon` trains the wrong way without an error, and
# `num_iterations=0` trains no step.
SETTING_RANGES = {
    "temperature": (lambda v: v > 0, "> 0 (sampling divides the logits by it)"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1] (1: no nucleus filtering)"),
    "top_k": (lambda v: v >= 0, ">= 0 (0: no top-k filtering)"),
    "min_p": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "repetition_penalty": (lambda v: v > 0, "> 0 (1: no penalty)"),
    "learning_rate": (lambda v: v >= 0, ">= 0"),
    "beta": (lambda v: v >= 0, ">= 0 (0: no KL term)"),
    "epsilon": (lambda v: v >= 0, ">= 0 (the clip range)"),
    "num_iterations": (lambda v: v >= 1, ">= 1 (updates per generation batch)"),
}


def check_setting_ranges(config: Any) -> None:
    """Raise a `ValueError` naming the first setting of `SETTING_RANGES` (one value, or one per agent) out of its
    range; `None` (no value) passes."""
    for name, (allowed, bound) in SETTING_RANGES.items():
        value = getattr(config, name, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(v is not None and not isinstance(v, bool) and not allowed(v) for v in values):
            raise ValueError(f"`{name}` must be {bound}, got {value!r}.")


@dataclass
class MultiAgentGRPOConfig(GRPOConfig):
    r"""
    Configuration for `MultiAgentGRPOTrainer`: every `trl.GRPOConfig` field, applied to each agent, plus the
    fields below.

    Parameters:
        num_agents (`int` or `None`, *optional*, defaults to `None`):
            Number of agents. `None` infers it from the models passed to the trainer (the length of the list, or 1 for
            a single model). With one model id or path and `num_agents=N`, the trainer loads N independent copies.
        joint_mode (`str`, *optional*, defaults to `"aligned"`):
            How joint samples are formed from the `num_generations` (G) completions of each agent. Allowed values:

            - `"aligned"`: joint sample j is (agent 0's j-th, ..., agent N-1's j-th) completion; one reward each; every
              agent's j-th completion gets the group-normalized advantage of that reward.
            - `"cross"`: all G^N tuples are scored; agent i's completion k is credited with the mean reward of the
              tuples that contain it, and advantages are normalized per agent per group. Costs G^N reward calls
              per prompt.
        agent_learning_rates (`list[float]` or `None`, *optional*, defaults to `None`):
            One learning rate per agent (its own AdamW parameter group, following the same schedule). `None` uses
            `learning_rate` for every agent.
        generation_mode (`str`, *optional*, defaults to `"batched"`):
            `"batched"` generates for all agents in one `generate` call when their generation settings agree, each
            row with its agent's weights (`team.agent_rows`): LoRA adapters on a shared base, and separate
            models of one architecture and config (plain models on one device, not sharded; others generate one
            agent at a time). `"per_agent"` makes one call per agent.
        save_merged_models (`bool`, *optional*, defaults to `False`):
            With LoRA adapters, `save_model` also writes `agent_{i}/merged/`, a full model with the adapter merged in.
        num_turns (`int`, *optional*, defaults to `1`):
            Turns per episode. With more than one, the trainer's `external_transition` builds each agent's next prompt
            from the agents' completions (feedback from a checker, tests, the other agent's answer). Every turn is
            scored by the joint reward; each agent is trained on every turn, with group-relative advantages of the
            return. `rollout` sets the shape.
        rollout (`str`, *optional*, defaults to `"tree"`):
            The shape of a multi-turn rollout (`multiagent_trl.rollout.tree`). Allowed values:

            - `"tree"` (MAGRPO's definition): every joint sample of a turn spawns a node of G new joint samples at the
              next turn, whose prompts the transition makes from that sample's history. Turn t holds up to
              `G**t` nodes per prompt (`(G**N)**t` with `joint_mode="cross"`): generation and reward calls grow as
              G^T (`max_rollout_completions` bounds them). A node's G samples share one state and form one
              advantage group; a sample's return is its reward plus `discount` times the mean return of its child.
            - `"linear"`: G trajectories per prompt, one joint sample each per turn (G completions per agent per turn);
              turn-t advantages compare the G trajectories of a prompt, whose states differ. Aligned joint samples
              only.
        discount (`float`, *optional*, defaults to `1.0`):
            Weight of the next turn in a return: tree, `R = r + discount * mean(R_child)`; linear, the return-to-go
            `R_t = r_t + discount * R_{t+1}`.
        early_termination_threshold (`float` or `None`, *optional*, defaults to `None`):
            Ends an episode early (after the reward processor). Tree: a node whose mean joint reward exceeds it has no
            children (no transition, generation or reward call below it). Linear: a trajectory whose joint reward
            exceeds it plays no more turns. What the ended samples return: `ended_return`. `None` never ends one
            early.
        ended_return (`str`, *optional*, defaults to `"stand"`):
            What a node or trajectory that `early_termination_threshold` ended before the last turn returns. Allowed
            values: `"stand"`, its answer stands: each remaining turn scores its last reward again, discounted (in
            both shapes: finishing sooner is never worth less than finishing later at the same reward); `"reward"`,
            the rewards it received only (CoMLRL's sum; `MAGRPOConfig`'s default), so that with non-negative rewards a
            later success can return more than an early one.
        max_rollout_completions (`int`, *optional*, defaults to `4096`):
            The most completions one agent may generate for one generation batch on one process, counted before
            training with no early termination (`rollout.tree.tree_completions`); a larger rollout raises at
            construction, naming what to lower.
        cross_credit (`str`, *optional*, defaults to `"mean"`):
            With `joint_mode="cross"`: how a completion's credit is formed from the G^(N-1) tuples that hold it,
            `"mean"` or `"sum"` (CoMLRL's; the same advantages under normalization, G^(N-1) times larger without).
        external_prompt_passthrough (`bool`, *optional*, defaults to `False`):
            For CoMLRL-style transitions only (keyword arguments `agent_completions`, ...): use the prompts they return
            as they are, instead of passing them to the agent's formatter as `formatter(row, external_prompts=...)`.
        eval_do_sample (`bool`, *optional*, defaults to `True`):
            Decoding during evaluation: sampled with the training settings (`True`), or greedy (`False`).
        advantage_baseline (`str`, *optional*, defaults to `"mean"`):
            What each reward is compared with, within its group of G, before `scale_rewards`. Allowed values:
            `"mean"` (the group mean: GRPO, computed by TRL), `"none"` (the reward itself: REINFORCE), `"max"` (the
            group's best reward: every advantage is at most 0), `"leave_one_out"` (the mean of the other G - 1
            rewards: RLOO). With `scale_rewards` other than `"none"`, the baselined rewards are then centered and
            divided by their standard deviation, so that every baseline gives GRPO's normalized advantages.
        agent_devices (`str`, `list[str]` or `None`, *optional*, defaults to `None`):
            Each agent's device (`"cuda:0"`, `"cuda:1"`, `"cpu"`, ...), in a single process: each agent's model
            lives on its own device (model parallelism across agents; inputs and outputs cross over). One device per
            agent, one device for all (a string or a list of one), or `"auto"`: one CUDA device per agent when there
            are enough, all on `cuda:0` when fewer, the CPU without CUDA. With `num_agents` set, the config holds one
            device per agent from then on (without it, the trainer resolves the devices for its agents). `None`
            leaves placement to Accelerate (every agent on the process's device). Not with a multi-process launch.
        reference_devices (`str`, `list[str]` or `None`, *optional*, defaults to `None`):
            With `agent_devices` and `beta != 0`: each agent's reference model's device, in `agent_devices`' forms;
            `None` puts each on its agent's device.
        vllm_max_loras (`int` or `None`, *optional*, defaults to `None`):
            With `use_vllm=True` and a LoRA team: how many adapters the team's one engine holds at once; at least
            `num_agents` (every agent's adapter serves in each generation call). `None` uses `num_agents`.

            vLLM (`use_vllm=True`, `vllm_mode="colocate"`; see `multiagent_trl.vllm.engine`): a LoRA team runs one
            engine on its shared base with one adapter per agent, synced adapter-only after each update; separate
            models run one engine each, and each engine gets `vllm_gpu_memory_utilization / num_agents` of the
            device (raise `vllm_gpu_memory_utilization` for the team's total share).
        vllm_server_base_url (`str`, `list[str]` or `None`, *optional*, defaults to `None`):
            With `vllm_mode="server"` (see `multiagent_trl.vllm.server`): the base URL of the LoRA team's one server
            (every agent's adapter), or one URL per agent (separate models, one server each). `None` uses
            `vllm_server_host` with `vllm_server_port`.
        vllm_server_port (`int` or `list[int]`, *optional*, defaults to `8000`):
            With `vllm_mode="server"` and no `vllm_server_base_url`: the port of the LoRA team's server, or one port
            per agent.
        compile_generation (`bool`, *optional*, defaults to `False`):
            Decode with a static KV cache (`cache_implementation="static"`) and a `torch.compile`d decoding step, on
            every device (TRL builds its generation config with compilation off). Each agent's model is compiled once,
            at its first generation. The same tokens as the plain path; whether it is faster depends on the model and
            the device (`docs/benchmarks.md` has the measurements; on the development machine's CPU the
            compile takes about a minute, so it does not pay off in short runs). Not with continuous batching.
        compile_generation_kwargs (`dict` or `None`, *optional*, defaults to `None`):
            With `compile_generation=True`: `torch.compile` arguments, as `transformers.CompileConfig` fields
            (`backend`, `mode`, `dynamic`, `fullgraph`, ...), e.g. `{"mode": "reduce-overhead"}` on a GPU. `None`:
            inductor, dynamic shapes left to torch, graph breaks allowed.

    > Per-agent settings
    >
    > `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, `max_completion_length`, `generation_kwargs`
    > and `beta` take one value for every agent (as in `GRPOConfig`, with its defaults) or a list with one value per
    > agent, e.g. `temperature=[0.7, 1.0]`, `max_completion_length=[64, 256]`, `beta=[0.0, 0.04]`,
    > `generation_kwargs=[{"no_repeat_ngram_size": 3}, None]`. A list of one value means one value for all (that is
    > what `--temperature 0.7` parses to; `--temperature 0.7 1.0` gives one per agent; `--generation_kwargs` takes a
    > JSON object, or a JSON list of objects). A list of another length than the number of agents is an error, raised
    > here when `num_agents` is set and by the trainer otherwise. Read agent i's value with `agent_setting(name, i)`.

    > [!NOTE]
    > Defaults that differ from `trl.GRPOConfig`:
    > - `bf16`: `None` (unset) resolves to `True` only where a bf16-capable GPU is present, so the same script runs
    >   on a CPU-only machine without turning it off by hand. An explicit `bf16=True` is kept.
    """

    # The per-agent settings (see AGENT_SETTINGS): typed as lists so that the command line takes one value or one per
    # agent; `__post_init__` turns a list of one value into that value.
    max_completion_length: list[int] | None = field(
        default_factory=lambda: [512],
        metadata={"help": "Maximum length of the generated completion: one value for all agents, or one per agent."},
    )
    temperature: list[float] = field(
        default_factory=lambda: [1.0],
        metadata={"help": "Sampling temperature: one value for all agents, or one per agent."},
    )
    top_p: list[float] = field(
        default_factory=lambda: [1.0],
        metadata={"help": "Nucleus sampling probability in (0, 1]: one value for all agents, or one per agent."},
    )
    top_k: list[int] = field(
        default_factory=lambda: [0],
        metadata={"help": "Top-k sampling (0 disables it): one value for all agents, or one per agent."},
    )
    min_p: list[float] | None = field(
        default=None,
        metadata={"help": "Minimum token probability, relative to the likeliest token: one value, or one per agent."},
    )
    repetition_penalty: list[float] = field(
        default_factory=lambda: [1.0],
        metadata={"help": "Repetition penalty (1.0 is none): one value for all agents, or one per agent."},
    )
    beta: list[float] = field(
        default_factory=lambda: [0.0],
        metadata={
            "help": "KL coefficient (0.0 loads no reference model): one value for all agents, or one per agent."
        },
    )

    num_agents: int | None = field(
        default=None,
        metadata={
            "help": "Number of agents. None infers it from the models given to the trainer; with one model id or "
            "path, the trainer loads num_agents independent copies."
        },
    )
    joint_mode: str = field(
        default="aligned",
        metadata={
            "help": "How joint samples are formed: 'aligned' (the j-th completions of all agents form one joint "
            "sample) or 'cross' (all num_generations**num_agents tuples are scored; each completion is credited "
            "with the mean reward of the tuples that contain it).",
            "choices": list(JOINT_MODES),
        },
    )
    agent_learning_rates: list[float] | None = field(
        default=None,
        metadata={"help": "One learning rate per agent. None uses `learning_rate` for every agent."},
    )
    generation_mode: str = field(
        default="batched",
        metadata={
            "help": "'batched' generates for all agents in one generate call (LoRA adapters on one base, or "
            "separate models of one architecture and config); 'per_agent' makes one call per agent.",
            "choices": list(GENERATION_MODES),
        },
    )
    save_merged_models: bool = field(
        default=False,
        metadata={"help": "LoRA teams only: also save each agent's adapter merged into the base, in agent_i/merged/."},
    )

    num_turns: int = field(
        default=1,
        metadata={"help": "Turns per episode; more than one needs the trainer's `external_transition`."},
    )
    rollout: str = field(
        default="tree",
        metadata={
            "help": "Multi-turn rollout shape: 'tree' (every joint sample spawns G more at the next turn; MAGRPO) or "
            "'linear' (G trajectories per prompt).",
            "choices": list(ROLLOUT_SHAPES),
        },
    )
    discount: float = field(
        default=1.0, metadata={"help": "Weight of the next turn's return in a turn's return (multi-turn)."}
    )
    early_termination_threshold: float | None = field(
        default=None,
        metadata={"help": "End a node (tree) or trajectory (linear) whose joint reward exceeds this (multi-turn)."},
    )
    ended_return: str = field(
        default="stand",
        metadata={
            "help": "What an episode ended early by the threshold returns: 'stand' (its last reward for each "
            "remaining turn, discounted) or 'reward' (the rewards it received: CoMLRL's sum).",
            "choices": ["stand", "reward"],
        },
    )
    max_rollout_completions: int = field(
        default=4096,
        metadata={"help": "The most completions per agent one generation batch's rollout may need on one process."},
    )
    cross_credit: str = field(
        default="mean",
        metadata={
            "help": "joint_mode='cross': credit a completion with the 'mean' or the 'sum' (CoMLRL) of its tuples.",
            "choices": ["mean", "sum"],
        },
    )
    external_prompt_passthrough: bool = field(
        default=False,
        metadata={"help": "CoMLRL-style transitions: use their prompts as they are instead of through the formatter."},
    )
    eval_do_sample: bool = field(
        default=True, metadata={"help": "Sample during evaluation (True) or decode greedily (False)."}
    )
    compile_generation: bool = field(
        default=False,
        metadata={
            "help": "Decode with a static KV cache and a torch.compile'd decoding step, compiled once per agent (not "
            "with continuous batching)."
        },
    )
    compile_generation_kwargs: dict | None = field(
        default=None,
        metadata={"help": "With compile_generation: torch.compile arguments (CompileConfig fields): backend, mode."},
    )

    advantage_baseline: str = field(
        default="mean",
        metadata={
            "help": "Baseline of the advantage within a group: 'mean' (GRPO), 'none' (REINFORCE), 'max' (the best "
            "reward of the group) or 'leave_one_out' (RLOO); then scaled as `scale_rewards` says.",
            "choices": list(ADVANTAGE_BASELINES),
        },
    )
    agent_devices: list[str] | None = field(
        default=None,
        metadata={
            "help": "Each agent's device in a single process: one per agent (e.g. cuda:0 cuda:1), one for all, or "
            "auto; None: Accelerate's."
        },
    )
    reference_devices: list[str] | None = field(
        default=None,
        metadata={
            "help": "With agent_devices: the reference models' devices, in agent_devices' forms; None: the agent's."
        },
    )
    vllm_max_loras: int | None = field(
        default=None,
        metadata={
            "help": "With use_vllm and a LoRA team: adapters the one engine holds at once, at least num_agents. "
            "None: num_agents."
        },
    )
    # TRL's server fields, typed as lists: a team of separate models talks to one server per agent.
    vllm_server_base_url: list[str] | None = field(
        default=None,
        metadata={
            "help": "vllm_mode='server': the server's base URL (a LoRA team), or one per agent (separate models). "
            "If given, vllm_server_host and vllm_server_port are ignored."
        },
    )
    vllm_server_port: list[int] = field(
        default_factory=lambda: [8000],
        metadata={
            "help": "vllm_mode='server': the server's port (a LoRA team), or one per agent; on vllm_server_host."
        },
    )

    def __init_subclass__(cls, **kwargs):
        # A subclass's `__post_init__` reads, compares and maps its fields before calling ours, so the value checks
        # (`check_field_values`) must come first in each: a NaN, a fraction or a string flag would pass its range
        # checks, or be mapped under another field's name. The one that runs first may be a mixin's listed before
        # this class (`RewardModelFields`): whichever the class resolves to is wrapped, once.
        super().__init_subclass__(**kwargs)
        post_init = cls.__post_init__
        if not getattr(post_init, "checks_values_first", False):

            @functools.wraps(post_init)
            def checked_post_init(self):
                check_field_values(self)
                post_init(self)

            checked_post_init.checks_values_first = True
            cls.__post_init__ = checked_post_init

    def __post_init__(self):
        check_field_values(self)
        self._normalize_agent_settings()
        check_setting_ranges(self)
        # TRL resolves an unset bf16 to True, which fails on a machine without a bf16-capable accelerator. Resolve it
        # from the hardware instead; an explicit choice is left to TRL and transformers to validate.
        if self.bf16 is None and not self.fp16:
            self.bf16 = is_torch_bf16_gpu_available()
        if self.num_generations is not None and self.num_generations < 2:
            raise ValueError(
                f"`num_generations` must be at least 2, got {self.num_generations}: GRPO's advantage compares each "
                "completion with the others sampled for the same prompt."
            )
        super().__post_init__()

        if self.joint_mode not in JOINT_MODES:
            raise ValueError(f"`joint_mode` must be one of {JOINT_MODES}, got {self.joint_mode!r}.")
        if self.generation_mode not in GENERATION_MODES:
            raise ValueError(f"`generation_mode` must be one of {GENERATION_MODES}, got {self.generation_mode!r}.")
        if self.num_agents is not None and self.num_agents < 1:
            raise ValueError(f"`num_agents` must be at least 1, got {self.num_agents}.")
        if self.agent_learning_rates is not None:
            if self.num_agents is not None and len(self.agent_learning_rates) != self.num_agents:
                raise ValueError(
                    f"`agent_learning_rates` has {len(self.agent_learning_rates)} values but `num_agents` is "
                    f"{self.num_agents}: give one learning rate per agent, or set `learning_rate` for all."
                )
            if any(lr < 0 for lr in self.agent_learning_rates):
                raise ValueError(f"`agent_learning_rates` must be non-negative, got {self.agent_learning_rates}.")
        if self.advantage_baseline not in ADVANTAGE_BASELINES:
            raise ValueError(
                f"`advantage_baseline` must be one of {ADVANTAGE_BASELINES}, got {self.advantage_baseline!r}."
            )
        if self.advantage_baseline != "mean" and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"`advantage_baseline={self.advantage_baseline!r}` applies to the weighted sum of the rewards: set "
                "`multi_objective_aggregation='sum_then_normalize'`."
            )
        if self.reference_devices is not None and self.agent_devices is None:
            raise ValueError("`reference_devices` needs `agent_devices` (one device per agent) too.")
        for name in ("agent_devices", "reference_devices") if self.agent_devices is not None else ():
            if getattr(self, name) is not None:
                check_devices(getattr(self, name), name, self.num_agents, self.world_size)
                if self.num_agents is not None:  # one device per agent; else the trainer resolves them
                    setattr(self, name, resolve_devices(getattr(self, name), self.num_agents, name))
        if self.num_agents is not None:
            self.check_agent_settings(self.num_agents)
        if self.num_turns < 1:
            raise ValueError(f"`num_turns` must be at least 1, got {self.num_turns}.")
        lengths = (
            self.max_completion_length
            if isinstance(self.max_completion_length, list)
            else [self.max_completion_length]
        )
        if any(length is not None and length < 1 for length in lengths):
            raise ValueError(
                f"`max_completion_length` must be at least 1 token (per agent), got {self.max_completion_length}."
            )
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"`discount` must be in [0, 1], got {self.discount}.")
        if self.rollout not in ROLLOUT_SHAPES:
            raise ValueError(f"`rollout` must be one of {ROLLOUT_SHAPES}, got {self.rollout!r}.")
        if self.cross_credit not in ("mean", "sum"):
            raise ValueError(f"`cross_credit` must be 'mean' or 'sum', got {self.cross_credit!r}.")
        if self.ended_return not in ("stand", "reward"):
            raise ValueError(f"`ended_return` must be 'stand' or 'reward', got {self.ended_return!r}.")
        if self.num_turns > 1 and self.rollout == "linear" and self.joint_mode != "aligned":
            raise ValueError(
                "`rollout='linear'` with `num_turns > 1` needs `joint_mode='aligned'`: a trajectory continues one "
                "joint sample per turn, and a prompt's G**N cross tuples have no G continuations. Use "
                "`rollout='tree'`, where every cross tuple spawns its own node."
            )
        self.check_rollout_size()
        if self.joint_mode == "cross":
            # Cross tuples are formed within a prompt group, so each process must hold whole groups.
            local_batch = self.per_device_train_batch_size * self.steps_per_generation
            if local_batch % self.num_generations != 0:
                raise ValueError(
                    f"`joint_mode='cross'` needs whole prompt groups on each process: per_device_train_batch_size * "
                    f"steps_per_generation ({local_batch}) must be a multiple of num_generations "
                    f"({self.num_generations})."
                )
        if self.use_vllm:
            if self.vllm_mode not in ("colocate", "server"):
                raise ValueError(f"`vllm_mode` must be 'colocate' or 'server', got {self.vllm_mode!r}.")
            from .vllm.engine import check_vllm_installed  # this module imports vLLM only when an engine starts

            check_vllm_installed()
        if self.compile_generation_kwargs is not None and not self.compile_generation:
            raise ValueError("`compile_generation_kwargs` applies with `compile_generation=True` only: set it too.")
        if self.compile_generation and self.cache_implementation not in (None, "static"):
            raise ValueError(
                f"`compile_generation=True` decodes with a static KV cache, but `cache_implementation` is "
                f"{self.cache_implementation!r}: set it to None or 'static'."
            )
        if self.compile_generation and self.use_transformers_continuous_batching:
            raise ValueError(
                "`compile_generation=True` compiles `generate`, which continuous batching does not call: set one of "
                "them, or compile the paged path with `transformers_continuous_batching_config="
                "{'default_compile_level': 1}`."
            )

    def check_rollout_size(self, num_agents: int | None = None) -> None:
        """Raise a `ValueError` when one generation batch's rollout, on one process and with no early termination,
        would need more than `max_rollout_completions` completions per agent (the tree grows as G^T)."""
        num_agents = num_agents or self.num_agents or 1
        cross = self.joint_mode == "cross" and num_agents > 1
        checks = [("train", self.per_device_train_batch_size * self.steps_per_generation, self.num_generations)]
        eval_width = self.num_generations_eval or self.num_generations
        if self.eval_strategy != "no":
            checks.append(("eval", self.per_device_eval_batch_size, eval_width))
        for mode, rows, width in checks:
            prompts = max(rows // width, 1)
            needed = tree_completions(prompts, width, num_agents, self.num_turns, cross, self.rollout)
            if needed > self.max_rollout_completions:
                raise ValueError(
                    f"A {mode} rollout of {self.num_turns} turns ({self.rollout} shape, {prompts} prompts per "
                    f"process, G={width}, {num_agents} agents{', cross' if cross else ''}) needs up to {needed} "
                    f"completions per agent, more than `max_rollout_completions={self.max_rollout_completions}`. "
                    "Lower `num_generations`, `num_turns` or the batch size, use `rollout='linear'` (G per turn), or "
                    "raise `max_rollout_completions` if the memory and time allow."
                )

    # ------------------------------------------------------------------ per-agent settings

    def _normalize_agent_settings(self) -> None:
        """One value for all, or a list of one value per agent: a list of one value becomes that value."""
        for name in ("vllm_server_base_url", "vllm_server_port"):  # one server for all, or one per agent
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                setattr(self, name, value[0] if len(value) == 1 else list(value))
        kwargs = self.generation_kwargs
        if isinstance(kwargs, str) and kwargs.lstrip().startswith("["):
            self.generation_kwargs = json.loads(kwargs)  # one JSON object per agent (TRL parses a single object)
        for name in AGENT_SETTINGS:
            value = getattr(self, name)
            if name == "generation_kwargs" and not isinstance(value, (list, tuple)):
                continue  # a dict (or its JSON text) for every agent
            if isinstance(value, (list, tuple)):
                if len(value) == 0:
                    raise ValueError(f"`{name}` is an empty list: give one value for all agents, or one per agent.")
                value = value[0] if len(value) == 1 else list(value)
                setattr(self, name, value)
            if name == "generation_kwargs" and isinstance(value, list):
                bad = [v for v in value if v is not None and not isinstance(v, dict)]
                if bad:
                    raise TypeError(
                        f"`generation_kwargs` lists one entry per agent, each a dict or None; got {bad[0]!r}."
                    )

    def per_agent_settings(self) -> dict[str, list]:
        """The settings given as one value per agent (a list of two or more values), by name."""
        return {name: getattr(self, name) for name in AGENT_SETTINGS if isinstance(getattr(self, name), list)}

    def check_agent_settings(self, num_agents: int) -> None:
        """Raise a `ValueError` naming the first per-agent setting whose list does not have `num_agents` values."""
        for name, values in self.per_agent_settings().items():
            if len(values) != num_agents:
                raise ValueError(
                    f"`{name}` has {len(values)} values ({values}) for {num_agents} agents: give one value for all "
                    f"agents, or exactly one per agent."
                )

    def agent_setting(self, name: str, index: int) -> Any:
        """Agent `index`'s value of the per-agent setting `name` (one of `AGENT_SETTINGS`).

        >>> config = MultiAgentGRPOConfig(output_dir="out", temperature=[0.5, 0.9], report_to="none")
        >>> config.agent_setting("temperature", 1), config.agent_setting("top_p", 1)
        (0.9, 1.0)
        """
        if name not in AGENT_SETTINGS:
            raise KeyError(f"`{name}` is not a per-agent setting; those are {AGENT_SETTINGS}.")
        value = getattr(self, name)
        if isinstance(value, list):
            if not 0 <= index < len(value):
                raise IndexError(f"`{name}` has {len(value)} values; there is no value for agent {index}.")
            return value[index]
        return value

    @contextmanager
    def single_agent_view(self, index: int, **overrides: Any) -> Iterator[MultiAgentGRPOConfig]:
        """Within the block, every per-agent setting holds agent `index`'s value (and each field in `overrides` its
        given value), so that code written for one policy, like `GRPOTrainer.__init__`, reads plain values."""
        values = {name: self.agent_setting(name, index) for name in AGENT_SETTINGS}
        values.update(overrides)
        saved = {name: getattr(self, name) for name in values}
        for name, value in values.items():
            setattr(self, name, value)
        try:
            yield self
        finally:
            for name, value in saved.items():
                setattr(self, name, value)


def team_config(model: Any, args: MultiAgentGRPOConfig | None) -> MultiAgentGRPOConfig:
    """The trainer's config: `args`, or the defaults for `None`; raises, naming the fix, where `model` is missing or
    `args` is not a `MultiAgentGRPOConfig` (a plain `GRPOConfig`, say)."""
    if model is None:
        raise ValueError("Pass the agents: `model=` (an id, a path, a model, or a list of them).")
    if args is None:
        return MultiAgentGRPOConfig(output_dir="multiagent-grpo-output")
    if not isinstance(args, MultiAgentGRPOConfig):
        raise TypeError(
            f"`args` is a {type(args).__name__}; MultiAgentGRPOTrainer needs a MultiAgentGRPOConfig (or "
            "MAGRPOConfig), which takes every GRPOConfig field: replace `GRPOConfig(` with `MultiAgentGRPOConfig(`."
        )
    return args
