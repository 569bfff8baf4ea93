"""`MultiAgentGRPOConfig`: every `GRPOConfig` field, applied to each agent, plus the team's own fields."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers.utils import is_torch_bf16_gpu_available
from trl import GRPOConfig

from .placement import check_devices

JOINT_MODES = ("aligned", "cross")
GENERATION_MODES = ("batched", "per_agent")
ADVANTAGE_BASELINES = ("mean", "none", "max", "leave_one_out")


@dataclass
class MultiAgentGRPOConfig(GRPOConfig):
    r"""
    Configuration for [`MultiAgentGRPOTrainer`]: every [`~trl.GRPOConfig`] field, applied to each agent, plus the
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
            With one LoRA adapter per agent on a shared base, `"batched"` generates for all agents in one `generate`
            call (PEFT mixed-adapter batch); `"per_agent"` makes one call per agent. Separate models always generate
            one agent at a time.
        save_merged_models (`bool`, *optional*, defaults to `False`):
            With LoRA adapters, `save_model` also writes `agent_{i}/merged/`, a full model with the adapter merged in.
        num_turns (`int`, *optional*, defaults to `1`):
            Turns per episode. With more than one, the trainer's `external_transition` builds each agent's next prompt
            from the agents' completions (feedback from a checker, tests, the other agent's answer). Every turn is
            scored by the joint reward; each agent is trained on every turn, with group-relative advantages of the
            return-to-go. Rollouts are linear: `num_generations` trajectories per prompt, one completion per agent
            per turn (not `num_generations**num_turns`).
        discount (`float`, *optional*, defaults to `1.0`):
            Discount of later turns' rewards in the return-to-go: `R_t = r_t + discount * R_{t+1}`.
        early_termination_threshold (`float` or `None`, *optional*, defaults to `None`):
            A trajectory ends after a turn whose joint reward (after the reward processor) exceeds this value: it
            gets no further transition, reward or gradient. `None` never ends one early.
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
        agent_devices (`list[str]` or `None`, *optional*, defaults to `None`):
            One device per agent (`"cuda:0"`, `"cuda:1"`, `"cpu"`, ...), in a single process: each agent's model
            lives on its own device (model parallelism across agents; inputs and outputs cross over). `None` leaves
            placement to Accelerate (every agent on the process's device). Not with a multi-process launch.
        reference_devices (`list[str]` or `None`, *optional*, defaults to `None`):
            With `agent_devices` and `beta != 0`: one device per agent's reference model; `None` puts each on its
            agent's device.

    > [!NOTE]
    > Defaults that differ from [`~trl.GRPOConfig`]:
    > - `bf16`: `None` (unset) resolves to `True` only where a bf16-capable GPU is present, so the same script runs
    >   on a CPU-only machine without turning it off by hand. An explicit `bf16=True` is kept.
    """

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
            "help": "LoRA teams only: 'batched' generates for all agents in one generate call (mixed-adapter "
            "batch); 'per_agent' makes one call per agent.",
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
    discount: float = field(
        default=1.0, metadata={"help": "Discount of later turns' rewards in the return-to-go (multi-turn)."}
    )
    early_termination_threshold: float | None = field(
        default=None,
        metadata={"help": "End a trajectory after a turn whose joint reward exceeds this value (multi-turn)."},
    )
    external_prompt_passthrough: bool = field(
        default=False,
        metadata={"help": "CoMLRL-style transitions: use their prompts as they are instead of through the formatter."},
    )
    eval_do_sample: bool = field(
        default=True, metadata={"help": "Sample during evaluation (True) or decode greedily (False)."}
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
        metadata={"help": "One device per agent in a single process (e.g. cuda:0 cuda:1); None: Accelerate's."},
    )
    reference_devices: list[str] | None = field(
        default=None,
        metadata={"help": "With agent_devices: one device per agent's reference model; None: the agent's."},
    )

    def __post_init__(self):
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
        if self.agent_devices is not None:
            check_devices(self.agent_devices, "agent_devices", self.num_agents, self.world_size)
            if self.reference_devices is not None:
                check_devices(self.reference_devices, "reference_devices", self.num_agents, self.world_size)
        if self.num_turns < 1:
            raise ValueError(f"`num_turns` must be at least 1, got {self.num_turns}.")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"`discount` must be in [0, 1], got {self.discount}.")
        if self.num_turns > 1 and self.joint_mode != "aligned":
            raise ValueError(
                "`num_turns > 1` needs `joint_mode='aligned'`: a trajectory continues one joint sample per turn, and "
                "cross tuples have no single continuation."
            )
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
            raise NotImplementedError(
                "`use_vllm=True` is not supported by MultiAgentGRPOTrainer yet: generation runs through transformers. "
                "Set `use_vllm=False`."
            )
        if self.use_transformers_continuous_batching:
            raise NotImplementedError(
                "`use_transformers_continuous_batching=True` is not supported by MultiAgentGRPOTrainer yet. Set it to "
                "False."
            )
        if self.sync_ref_model:
            raise NotImplementedError(
                "`sync_ref_model=True` is not supported by MultiAgentGRPOTrainer yet: each agent keeps its initial "
                "weights as reference. Set `sync_ref_model=False`."
            )
