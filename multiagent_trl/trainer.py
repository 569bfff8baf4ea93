"""`MultiAgentGRPOTrainer`: TRL's `GRPOTrainer`, run for N agents on one joint reward (MAGRPO).

How one generation batch flows (`_generate_and_score_completions`):

1. Each agent formats the batch's rows into its own prompts and generates G completions per prompt, independently.
2. The joint reward functions score tuples of completions: the aligned tuples (j-th of every agent) or, in
   `joint_mode="cross"`, all G^N tuples of each group, whose rewards are then credited back to each completion.
3. For each agent, TRL's own `_generate_and_score_completions` runs in that agent's *view* (its tokenizer,
   generation config, reference model, metrics), replaying the completions of step 1 and the credited rewards of
   step 2. TRL therefore computes the advantages (`scale_rewards`, `None` rewards, `reward_weights`), the old and
   reference log-probs, and the metrics, exactly as for one GRPO policy.

The loss (`_compute_loss`) is the sum of each agent's TRL GRPO loss on its own completions; agents share no
parameters, so each agent's gradient is its own loss's gradient.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from datasets import Dataset, IterableDataset
from peft import PeftConfig, PeftModel
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback, set_seed
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.trainer.utils import nanstd

from . import hub
from .config import MultiAgentGRPOConfig
from .rewards.advantages import local_baseline_advantages
from .rewards.joint import (
    agent_columns,
    apply_processor,
    bind_reward_funcs,
    check_model_rewards,
    credit_columns,
    flush_reward_logs,
    pop_agent_rewards,
    weighted_sum,
    with_rows,
)
from .rollout.evaluation import EvalRecorder, EvalTrajectories, decoding
from .rollout.generation import configure_decoding
from .rollout.logprob_kernel import use_faster_cpu_kernel
from .rollout.replay import Replay, Rollout, loss_parts
from .rollout.tree import (
    Level,
    batch_layout,
    continued_rows,
    link,
    next_level,
    padded,
    paths,
    returns,
    root_level,
    sample_members,
)
from .rollout.turns import Transition, completion_rows, is_prompt, turn_prefix
from .team import sharding
from .team.arguments import (
    check_callables,
    check_prompt_column,
    check_shared_tokenizer,
    check_team_arguments,
    per_agent,
)
from .team.checkpointing import save_atomically
from .team.loading import (
    add_adapters,
    add_reference_adapter,
    agent_adapter_names,
    check_peft_arguments,
    load_agents,
    load_processing_classes,
    reference_copies,
)
from .team.modules import AgentTeam, LoraAgentTeam
from .team.placement import place_agents
from .team.reference_sync import ReferenceSyncCallback, check_reference_sync
from .team.views import agent_views, load_entropy_states, same_generation_settings, save_entropy_states
from .tools.environments import REPLAY_STATE, TeamTools


class MultiAgentGRPOTrainer(GRPOTrainer):
    """Train N language-model agents with GRPO on one joint reward.

    A drop-in replacement for `trl.GRPOTrainer`: same arguments, same reward-function conventions, same launch
    commands; with one agent it trains exactly like `GRPOTrainer`. CoMLRL's argument names are
    `MAGRPOTrainer`'s.

    What differs from `GRPOTrainer`, and why:

    - `_generate_and_score_completions`: every agent generates, then the joint reward is computed once and TRL's
      own method runs per agent on the credited rewards (see the module docstring).
    - `_generate`, `_generate_single_turn`, `_calculate_rewards`: replay what was computed jointly (or generated
      for all LoRA agents in one batch), inside the per-agent pass (`rollouts.Replay`).
    - `_compute_loss`: the sum of the agents' own GRPO losses, with one backward per agent; each logged as
      `agent_{i}/loss`. Rows of a multi-turn batch that are not trained do not count in a loss that averages over
      rows (`grpo`, `sapo`, `luspo`, `dr_grpo`), so they do not shrink the trained rows' gradients.
    - `evaluation_loop`: with `record_eval_trajectories`, hands every evaluated episode to `trajectory_metrics`.
    - `create_optimizer`, `_clip_grad_norm`: one parameter group per agent (per-agent learning rates; a user's
      optimizer keeps its groups) and gradient clipping per agent, so one agent's large gradient does not shrink
      another's update.
    - `log`: per-agent metrics under `agent_{i}/...`; the joint `reward` and `reward_std` at the top level.
    - `_save`, `_load_from_checkpoint`: one folder per agent, `agent_{i}/`, each loadable with `from_pretrained`.
    - `_save_checkpoint`, `_load_optimizer_and_scheduler`: atomic checkpoints; each agent's entropy controller.
    - `push_to_hub`: every agent, one repo each (or one repo with `agent_i/` folders), each with its model card.

    Which of TRL's attributes are each agent's own is listed, with the reason, in `multiagent_trl.team.views`.

    Args:
        model (`str`, `PreTrainedModel`, or a list of them):
            The agents: one model id or path (loaded `args.num_agents` times), one model (a team of one), or one
            model or id per agent (sizes and architectures may differ).
        reward_funcs (callable or list of callables):
            Joint reward functions, CoMLRL style `f(completions1, ..., completionsN)` or TRL style
            `f(prompts, completions, **kwargs)` with `completions[j]` the tuple of the agents' completions of
            joint sample j (with one agent, the plain completion, as in TRL). Several combine with
            `args.reward_weights`. TRL's reward models (a sequence-classifier id, path or model, with its tokenizer
            from `reward_processing_classes`) work too: with several agents each scores the text `joint_text` builds
            from a joint sample (see `multiagent_trl.rewards.models`).
        args (`MultiAgentGRPOConfig`, *optional*):
            Configuration; `None` uses the defaults.
        train_dataset, eval_dataset (`datasets.Dataset`, *optional*):
            Rows with a `"prompt"` column, unless `formatters` builds the prompts. Other columns reach the reward
            functions as keyword arguments.
        processing_class (tokenizer, or one per agent, *optional*):
            Loaded from each agent's model when `None`.
        callbacks, optimizers:
            As in `transformers.Trainer`.
        reward_processor (`Callable[[float], float]`, *optional*):
            Applied to each joint reward (the weighted sum of the reward functions) before advantages, e.g.
            `RewardProcessors.scale(100.0)`.
        peft_config (`PeftConfig`, or one per agent, *optional*):
            With one base (a model id or path, or one model, and `args.num_agents=N`): one adapter per agent on a
            shared, frozen base, named `agent_0` ... `agent_{N-1}`. With a list of models: an adapter on each.
        formatters (callable or one per agent, *optional*):
            `formatter(row) -> prompt` builds an agent's prompt (text or conversation) from a dataset row.
        external_transition (callable, *optional*):
            Needed when `args.num_turns > 1`. `external_transition(row, histories, turn) -> prompts`: given the
            dataset row, each agent's completions so far (`histories[i]`, turns 0..turn) and the index of the turn
            just played, return each agent's prompt for the next turn. CoMLRL's keyword convention works too (see
            `multiagent_trl.rollout.turns`).
        joint_text (callable, *optional*):
            For reward models in `reward_funcs` with several agents: `joint_text(prompts, completions) -> str` builds
            the text a reward model scores from one joint sample (`prompts[i]` and `completions[i]` are agent i's).
            `None` uses `reward_models.default_joint_text` (the prompt, then each agent's completion under an
            `[agent_i]` header).
        **kwargs:
            Other `GRPOTrainer` arguments (`reward_processing_classes`, `quantization_config`, ...).

    Example:

    ```python
    from datasets import Dataset
    from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
    from multiagent_trl.testing import tiny_model_path

    def ratio_reward(completions1, completions2):
        return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(completions1, completions2)]

    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path(),  # or "Qwen/Qwen2.5-0.5B", or a list of models, one per agent
        reward_funcs=ratio_reward,
        args=MultiAgentGRPOConfig(output_dir="out", num_agents=2, max_steps=10),
        train_dataset=Dataset.from_dict({"prompt": ["Tell a story:"] * 8}),
    )
    trainer.train()
    trainer.save_model("out/final")  # out/final/agent_0/, out/final/agent_1/
    ```
    """

    _tag_names = ["trl", "grpo", "multiagent-trl", "magrpo"]
    _name = "MAGRPO"
    record_eval_trajectories = False  # True: `evaluate` collects every trajectory for `trajectory_metrics`
    rewards_per_sample = False  # True: CoMLRL-style reward functions are called once per joint sample, as CoMLRL does

    def __init__(
        self,
        model: str | PreTrainedModel | Sequence[str | PreTrainedModel] | None = None,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        args: MultiAgentGRPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | IterableDataset | dict[str, Dataset] | None = None,
        processing_class: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, torch.optim.lr_scheduler.LambdaLR | None] = (None, None),
        peft_config: PeftConfig | Sequence[PeftConfig] | None = None,
        *,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Callable | Sequence[Callable] | None = None,
        external_transition: Callable | None = None,
        joint_text: Callable | None = None,
        **kwargs,
    ):
        if model is None:
            raise ValueError("Pass the agents: `model=` (an id, a path, a model, or a list of them).")
        if args is None:
            args = MultiAgentGRPOConfig(output_dir="multiagent-grpo-output")
        elif not isinstance(args, MultiAgentGRPOConfig):
            raise TypeError(
                f"`args` is a {type(args).__name__}; MultiAgentGRPOTrainer needs a MultiAgentGRPOConfig (or "
                "MAGRPOConfig), which takes every GRPOConfig field: replace `GRPOConfig(` with "
                "`MultiAgentGRPOConfig(`."
            )

        sharding.check_launch(args)  # before loading models: every launched process must be in the run

        # 1. The agents: one base with one adapter per agent, or one model per agent (each with its own adapter if
        # asked). PEFT draws adapter weights from the global generator, so seed first, as GRPOTrainer does.
        set_seed(args.seed)
        check_peft_arguments(model, peft_config)
        adapter_names = agent_adapter_names(model, args.num_agents)  # a LoRA team's trained adapters, if given
        shared_base = adapter_names is not None or (
            peft_config is not None and isinstance(model, (str, os.PathLike, nn.Module))
        )
        models = load_agents(model, args, kwargs.get("quantization_config"), copies=not shared_base)
        if adapter_names is not None:
            args.num_agents = len(adapter_names)
        num_agents = args.num_agents = (args.num_agents or 1) if shared_base else len(models)
        args.check_agent_settings(num_agents)  # before anything reads an agent's value
        args.check_rollout_size(num_agents)  # the config counted `num_agents=None` as one agent
        betas = [args.agent_setting("beta", i) for i in range(num_agents)]
        check_team_arguments(args, num_agents, optimizers[1], adapter_names is not None, betas)
        trained_adapters = [m for m, beta in zip(models, betas) if isinstance(m, PeftModel) and beta != 0.0]
        models = add_adapters(models, per_agent("peft_config", peft_config, num_agents, PeftConfig), shared_base)
        for agent in trained_adapters:
            add_reference_adapter(agent)
        check_reference_sync(args, models)
        processing_classes = load_processing_classes(processing_class, models, args)
        check_shared_tokenizer(shared_base, processing_classes)
        team_tools = TeamTools.from_arguments(kwargs, num_agents, args)  # a team's tools go to the agents' views
        if num_agents > 1 and args.ddp_find_unused_parameters is None:
            # Each agent's forward and backward leaves the other agents' parameters unused (DDP must be told).
            args.ddp_find_unused_parameters = True

        # 2. How the agents see the task, and how their answers are scored.
        self.formatters = per_agent("formatters", formatters, num_agents)
        check_callables(self.formatters, reward_processor, external_transition, args.num_turns)
        self.external_transition = external_transition
        self._transition = None
        if external_transition is not None:
            self._transition = Transition(external_transition, self.formatters, args.external_prompt_passthrough)
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            check_prompt_column(name, dataset, self.formatters)
        reward_funcs, kwargs["reward_processing_classes"] = bind_reward_funcs(
            reward_funcs,
            num_agents,
            kwargs.get("reward_processing_classes"),
            args,
            joint_text,
            self.rewards_per_sample,
        )
        self.reward_processor = reward_processor

        # 3. TRL sets up agent 0 as its policy, with agent 0's per-agent settings. It must not build a reference model
        # (it would reload one from the model's path, which an in-memory model lacks, or add a second `ref` adapter):
        # beta is hidden from it, and each agent's reference comes from `reference_copies` or its adapters; so is
        # `sync_ref_model` (each agent's reference is synced by `reference_sync.ReferenceSyncCallback`).
        ref_models = reference_copies(models, betas[: len(models)])  # one model only on a shared base
        # TRL's own vLLM backend is built for one policy (and syncs a PEFT one by merging it): the team's engines are
        # `vllm_engine.TeamEngine`'s, so TRL is set up without one.
        with args.single_agent_view(0, beta=0.0, sync_ref_model=False, use_vllm=False):
            super().__init__(
                model=models[0],
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_classes[0],
                callbacks=callbacks,
                optimizers=optimizers,
                **kwargs,
            )
        self.beta = betas[0]
        self.num_agents = num_agents

        # 4. Each agent's own state (see `agent_state`), then "the model" that Trainer and Accelerate see: the team.
        if shared_base:
            models, ref_models = models * num_agents, ref_models * num_agents
            processing_classes = [self.processing_class] * num_agents
        self._agent_views = agent_views(self, models, processing_classes, ref_models, shared_base)
        self._team_tools = team_tools
        team_tools.install(self)
        configure_decoding(self, models)  # `compile_generation`, the sampling warpers (`rollout.sampling`)
        use_faster_cpu_kernel()  # TRL's log-prob kernel on CPUs: the same bits, faster (`logprob_kernel`)
        if shared_base:
            team = LoraAgentTeam(models[0], [f"agent_{i}" for i in range(num_agents)])
        else:
            team = AgentTeam(models)
        if sharding.is_fsdp2(self.accelerator):
            team = sharding.shard_team(team, self.accelerator)  # each agent's layers are its own FSDP units
        elif self.place_model_on_device and not self.is_model_parallel:
            self._move_model_to_device(team, self.args.device)
        if args.agent_devices is not None:
            place_agents(self, team, args.agent_devices, args.reference_devices)
        self.model = self.model_wrapped = self.callback_handler.model = team
        self._replay: Replay | None = None
        self._agent_rewards: torch.Tensor | None = None  # (rows, F, N): the last joint pass's per-agent rewards
        self._eval_recorder: EvalRecorder | None = None
        self._first_train_row: dict | None = None  # a model card's example (`hub.example_row`): a stream has no row 0
        if args.sync_ref_model:
            self.add_callback(ReferenceSyncCallback(self))
        self._vllm = None  # the team's vLLM engines or servers (`use_vllm=True`), synced at `_vllm_step`
        if args.use_vllm:
            from .vllm.engine import TeamEngine  # vLLM is imported only when it is used
            from .vllm.server import TeamServers

            if any(f is not None for f in team_tools.rollout_funcs):
                raise NotImplementedError(
                    "`rollout_func` with `use_vllm=True` is not supported for teams: TRL's rollout helpers call its "
                    "own single-policy engine. Generate with the team's engines (drop `rollout_func`), or set "
                    "`use_vllm=False`."
                )
            self._vllm = (TeamServers if args.vllm_mode == "server" else TeamEngine)(team, args, processing_classes)
            self._vllm_step = self.state.global_step

    def create_accelerator_and_postprocess(self) -> None:
        # FSDP runs on CPU too (gloo), and a requested engine that is not set up is an error, not a fallback.
        with sharding.fsdp_on_cpu(self.args):
            super().create_accelerator_and_postprocess()
        sharding.check_engine(self.accelerator, self.args)

    # ------------------------------------------------------------------ agent views

    @contextmanager
    def _swap(self, **attributes) -> Iterator[None]:
        saved = {name: getattr(self, name) for name in attributes}
        for name, value in attributes.items():
            setattr(self, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    @contextmanager
    def _agent_view(self, index: int) -> Iterator[None]:
        """Run TRL code as if agent `index` were the only policy: its `agent_state.PER_AGENT` values are swapped in
        (and its updates to them kept when the block ends), and the team routes `forward`/`generate` to it."""
        view = self._agent_views[index]
        saved = {name: getattr(self, name) for name in view}
        for name, value in view.items():
            setattr(self, name, value)
        try:
            with self.model.use(index):
                yield
        finally:
            for name in view:  # TRL reassigns some (the entropy controller), not only mutates them
                view[name] = getattr(self, name)
                setattr(self, name, saved[name])

    def agent_metric_prefix(self, index: int) -> str:
        """Prefix of agent `index`'s metrics: `agent_{index}/`, or nothing for a team of one (TRL's own names)."""
        return f"agent_{index}/" if self.num_agents > 1 else ""

    # ------------------------------------------------------------------ generation, rewards, advantages

    def _agent_inputs(self, inputs: list[dict], index: int) -> list[dict]:
        formatter = self.formatters[index] if self.formatters else None
        if formatter is None:
            if "prompt" not in inputs[0]:
                raise ValueError(
                    f"The dataset rows have no 'prompt' column (columns: {sorted(inputs[0])}). Add one, or pass "
                    "`formatters=` to build each agent's prompt from a row."
                )
            return inputs
        rows = [{**row, "prompt": formatter(row)} for row in inputs]
        for k, row in enumerate(rows):
            if not is_prompt(row["prompt"]):
                name = getattr(formatter, "__name__", type(formatter).__name__)
                raise ValueError(
                    f"`formatters` (agent {index}'s, {name}) returned {row['prompt']!r} for row {k}; a formatter must "
                    "return the agent's prompt: a string, or a conversation (a list of message dicts)."
                )
        return rows

    def _generate(self, prompts: list):
        if self._replay is not None and self._replay.rollout is not None:
            return self._replay.rollout.to_trl()
        return super()._generate(prompts)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self._replay is not None and self._replay.completion_ids is not None:
            return self._replay.completion_ids, self._replay.logprobs
        if self._vllm is not None:  # one agent's call (TRL's tool-calling loop): the active agent's rows
            completion_ids, logprobs = self._vllm_generate({self.model.active: prompt_ids})
            return completion_ids[self.model.active], logprobs[self.model.active]
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._replay is not None and self._replay.rewards is not None:
            return self._replay.rewards
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        for k, func in enumerate(self.reward_funcs):  # a team of one hands reward models to TRL, which checks none
            if isinstance(func, nn.Module):
                check_model_rewards(rewards[:, k].tolist(), self.reward_func_names[k])
        return rewards

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._first_train_row is None:
            self._first_train_row = dict(inputs[0])
        width = self.num_generations if mode == "train" else self.num_generations_eval
        agent_inputs = [self._agent_inputs(inputs, i) for i in range(self.num_agents)]
        agent_inputs = self._team_tools.begin_batch(self, inputs, agent_inputs)  # environments reset, tools bound
        levels = self._play(inputs, agent_inputs, width, mode)  # steps 1 and 2, turn by turn

        trained_rows = None  # a single turn trains every row
        if self.args.num_turns == 1:
            # 2b. Credit each agent's completions with the joint reward (TRL weighs and normalizes the functions'
            # rewards itself, unless a processor applies to their sum first).
            names, weights = self.reward_func_names, self.reward_weights
            if self.reward_processor is not None:
                names, weights = ["reward"], torch.ones(1)
            level, processor = levels[0], self.reward_processor
            columns = credit_columns(level.rewards_per_func, level.joint, self._agent_rewards, processor, weights)
            credited = agent_columns(columns, level.width, self.num_agents, level.samples != level.width, self.args)
            agent_rows, rollouts = level.agent_rows, level.rollouts
        else:
            # 2b. Returns over the rollout, each row credited with its own (or, in cross mode, its tuples').
            agent_rows, rollouts, credited, trained_rows = self._episode_batch(levels, mode)
            names, weights = ["return"], torch.ones(1)

        # 3. TRL's own scoring per agent: advantages, old/ref log-probs, metrics.
        outputs = self._score_agents(agent_rows, rollouts, credited, names, weights)
        self._log_joint_samples(levels, outputs)
        if trained_rows is not None:  # for `_compute_loss`: untrained rows must not count in a loss's row average
            for output in outputs:
                output["trained_rows"] = trained_rows
        return {f"agent_{i}/{key}": value for i, output in enumerate(outputs) for key, value in output.items()}

    def _play(self, inputs: list[dict], agent_inputs: list[list[dict]], width: int, mode: str) -> list[Level]:
        """Play the turns: each turn's nodes generate in one call and are scored in one call; the transition then
        makes the next turn's nodes (see `rollout_tree`). Returns the levels played, rewards and rollouts filled."""
        args, num_agents = self.args, self.num_agents
        cross = args.joint_mode == "cross" and num_agents > 1
        samples = width**num_agents if cross else width
        level = root_level(inputs, [[row["prompt"] for row in rows] for rows in agent_inputs], width, samples)
        level.agent_rows = agent_inputs  # each row's own prompt (an environment's reset may differ within a group)
        levels: list[Level] = []
        for turn in range(args.num_turns):
            # Collectives need the same rows on every process: a process with fewer live nodes fills up.
            level = padded(
                level, self._most_across_processes(len(level.nodes)), levels[-1].nodes[0] if levels else None
            )
            # 1. Every agent generates for every node of the turn; none sees another's completions.
            if turn > 0:
                level.agent_rows = level.agent_inputs(num_agents)
                # Each row's environments and tools continue those of the sample it follows (copied in a tree).
                self._team_tools.begin_turn(self, continued_rows(levels[-1], level), branch=level.width > 1)
            level.rollouts = self._rollouts(level.agent_rows, mode)
            # 2. Score the turn's joint samples in one call.
            self._joint_rewards(level, mode, turn if args.num_turns > 1 else None)
            levels.append(level)
            if turn == args.num_turns - 1:
                break
            level = next_level(level, args.rollout, args.early_termination_threshold, self._transition)
            if self._most_across_processes(len(level.nodes)) == 0:  # every node on every process has ended
                break
        link(levels, args.num_turns)
        if self._eval_recorder is not None and mode == "eval":
            self._eval_recorder.record(levels, paths(levels))
        return levels

    def _most_across_processes(self, count: int) -> int:
        if self.accelerator.num_processes == 1:
            return count
        return int(self.accelerator.gather(torch.tensor([count], device=self.accelerator.device)).max())

    def _episode_batch(self, levels: list[Level], mode: str):
        """Each agent's training rows over the whole rollout (`rollout_tree.batch_layout`), with its rollouts and
        the gathered `(rows, 1)` return it is credited with, and the number of trained rows over all processes (a
        0-d tensor); logs the returns per turn and the rollout's size."""
        args, metrics, device = self.args, self._metrics[mode], self.accelerator.device
        stand = args.ended_return == "stand"
        for turn, (level, value) in enumerate(zip(levels, returns(levels, args.discount, args.num_turns, stand))):
            level.returns = value
            node_returns = torch.nanmean(value.mean(dim=2), dim=1)[level.scored()]  # (real nodes,)
            stats = torch.tensor([node_returns.nansum(), len(node_returns)], device=device)
            total, count = self.accelerator.gather(stats).view(-1, 2).sum(dim=0).tolist()
            metrics[f"{turn_prefix(turn)}expected_return"].append(total / max(count, 1))
            metrics[f"{turn_prefix(turn)}nodes"].append(count)
        root = gather(levels[0].returns.mean(dim=2).flatten().to(device))
        metrics["reward"].append(torch.nanmean(root).item())  # the episode's return
        metrics["reward_std"].append(nanstd(root).item())

        multiple = args.steps_per_generation if mode == "train" else 1  # TRL splits a training batch into steps
        index, keep, credit = batch_layout(
            levels, args.rollout, args.num_turns, args.discount, multiple, args.cross_credit, stand
        )
        agent_rows, rollouts = [], []
        for i in range(self.num_agents):
            joined = [row for level in levels for row in level.agent_rows[i]]
            agent_rows.append([joined[k] for k in index])
            rollouts.append(Rollout.concat([level.rollouts[i] for level in levels], index).masked(keep))
        trained_rows = gather(torch.tensor([float(sum(keep))], device=device)).sum()
        return agent_rows, rollouts, [gather(c.to(device).unsqueeze(1)) for c in credit], trained_rows

    def _rollouts(self, agent_inputs: list[list[dict]], mode: str) -> list[Rollout]:
        """Every agent generates from its rows' prompts (one `generate` call for all agents in batched mode)."""
        prompts = [[row["prompt"] for row in rows] for rows in agent_inputs]
        with decoding(self, mode):
            logprobs = [None] * len(prompts)
            if self._vllm is not None and not self._team_tools.uses_tools:  # all agents in one engine call each
                completion_ids, logprobs = self._vllm_generate(dict(enumerate(self._tokenize_agents(prompts))))
            elif self._vllm is None and self._batched_generation():
                completion_ids = self._generate_batched(prompts)
            else:
                completion_ids = [None] * len(prompts)
            rollouts = []
            for i in range(self.num_agents):
                replay = Replay(completion_ids=completion_ids[i], logprobs=logprobs[i])
                with self._agent_view(i), self._swap(_replay=replay):
                    source = (
                        f"agent {i}'s `rollout_func`" if self.rollout_func is not None else f"agent {i}'s generation"
                    )
                    rollouts.append(Rollout.from_trl(self._generate(prompts[i])).check(len(prompts[i]), source))
        return rollouts

    def _vllm_state(self) -> dict[str, bool]:
        """TRL's `use_vllm` for its scoring and loss: on with the team's engines, so that TRL applies its
        importance-sampling correction (`vllm_importance_sampling_correction`) to each agent's vLLM log-probs. It stays
        off elsewhere: TRL's own engine (`vllm_generation`) is never built for a team."""
        return {"use_vllm": True} if self._vllm is not None else {}

    def _tokenize_agents(self, prompts: list[list]) -> list[list[list[int]]]:
        """Each agent's prompts as token ids, tokenized (and chat-templated) as TRL does in the agent's view."""
        prompt_ids = []
        for i, agent_prompts in enumerate(prompts):
            with self._agent_view(i):
                prompt_ids.append(self._tokenize_prompts(copy.deepcopy(agent_prompts))[0])
        return prompt_ids

    def _vllm_generate(self, prompt_ids: dict[int, list[list[int]]]):
        """Generate with the team's vLLM engines for the agents in `prompt_ids` (agent -> rows of token ids), each with
        its own sampling settings; syncs the engines first when an optimizer step changed the weights."""
        from .vllm.engine import AgentSampling

        if self.state.global_step != self._vllm_step:
            self._vllm.sync()
            self._vllm_step = self.state.global_step
        rows: list = [None] * self.num_agents
        sampling: list = [None] * self.num_agents
        for i, ids in prompt_ids.items():
            with self._agent_view(i):  # the agent's settings (`args.agent_setting`), greedy in evaluation if asked
                rows[i] = ids
                sampling[i] = AgentSampling(
                    max_tokens=self.max_completion_length,
                    temperature=self.temperature,
                    top_p=self.top_p,
                    top_k=self.top_k,
                    min_p=self.min_p,
                    repetition_penalty=self.repetition_penalty,
                    stop_token_ids=list(self.eos_token_ids),
                    greedy=not self.generation_config.do_sample,
                    extra=dict(self.args.agent_setting("generation_kwargs", i) or {}),
                )
        return self._vllm.generate(rows, sampling)

    def _batched_generation(self) -> bool:
        return (
            self.args.generation_mode == "batched"
            and self.model.batches_generation()
            and same_generation_settings(self._agent_views)  # else one at a time (a LoRA team logs it at __init__)
        )

    def _generate_batched(self, prompts: list[list]) -> list[list[list[int]]]:
        """Generate for all agents in one `generate` call (`team.mixed_batch`); one list of completion ids per agent.
        Decoding and metrics then run per agent in `_generate`, which replays its slice."""
        prompt_ids = self._tokenize_agents(prompts)
        with self.model.mixed_batch([len(ids) for ids in prompt_ids]):
            completion_ids, _ = super()._generate_single_turn(
                [ids for agent_ids in prompt_ids for ids in agent_ids], None, {}, self.num_generations
            )
        bounds = torch.tensor([0] + [len(ids) for ids in prompt_ids]).cumsum(0).tolist()
        return [completion_ids[start:end] for start, end in zip(bounds[:-1], bounds[1:])]

    def _score_agents(self, agent_inputs, rollouts: list[Rollout], credited, names, weights) -> list[dict[str, Any]]:
        """TRL's `_generate_and_score_completions` once per agent, replaying its rollout and credited rewards."""
        outputs = []
        for i in range(self.num_agents):
            replay = Replay(rollout=rollouts[i], rewards=credited[i])
            # TRL reads the number of reward functions from `reward_funcs`; it must match the replayed columns.
            swapped = dict(
                _replay=replay, reward_func_names=names, reward_weights=weights, reward_funcs=[None] * len(names)
            )
            swapped.update(REPLAY_STATE)  # the rollout's environments and tools were used in step 1
            swapped.update(self._vllm_state())
            with self._agent_view(i), self._swap(**swapped):
                outputs.append(super()._generate_and_score_completions(agent_inputs[i]))
            if self.args.advantage_baseline != "mean":  # TRL computed GRPO's; replace them with the baseline's
                outputs[-1]["advantages"] = local_baseline_advantages(self, weighted_sum(credited[i], weights))
        return outputs

    def _joint_rewards(self, level: Level, mode: str, turn: int | None = None) -> None:
        """Score the level's joint samples with every reward function, in one call. Fills `level.rewards_per_func`
        (gathered, `(tuples, F)`), `level.joint` (gathered, after the processor), `level.rewards` (this process's,
        `(nodes, samples, A)`) and `level.extras` (the columns functions logged with `log_extra`, gathered;
        `log_metric` values go to the metrics, under `turn_k/` in a multi-turn episode)."""
        num_agents, nodes = self.num_agents, len(level.nodes)
        tuples = [sample_members(level, n, j, num_agents) for n in range(nodes) for j in range(level.samples)]

        def joint(per_agent: list[list]) -> list:
            if num_agents == 1:  # a team of one gets exactly what TRL gives a reward function
                return [per_agent[0][t[0]] for t in tuples]
            return [tuple(values[k] for values, k in zip(per_agent, t, strict=True)) for t in tuples]

        level_rows = level.rows()
        rows = with_rows(self.reward_funcs, [level_rows[t[0]] for t in tuples])  # rows as a column, if asked
        prompts = [[row["prompt"] for row in rows_i] for rows_i in level.agent_rows]
        rewards = self._calculate_rewards(
            rows,
            joint(prompts),
            joint([r.completions for r in level.rollouts]),
            joint([r.completion_ids for r in level.rollouts]),
        )
        prefix = "" if turn is None else turn_prefix(turn)
        level.extras = flush_reward_logs(self, mode, prefix, len(tuples))
        scored = gather(level.scored().repeat_interleave(level.samples).to(rewards.device))
        rewards[~scored] = math.nan  # placeholders are not scored
        self._agent_rewards = pop_agent_rewards(self, rewards)  # where functions scored each agent on its own
        level.rewards_per_func = rewards
        level.joint = self._process_rewards(rewards, mode, prefix)
        local = slice(self.accelerator.process_index * len(tuples), (self.accelerator.process_index + 1) * len(tuples))
        per_agent = [level.joint[local]]
        if self._agent_rewards is not None:  # each agent's own weighted, processed reward
            per_agent = [
                weighted_sum(self._agent_rewards[local, :, i], self.reward_weights) for i in range(num_agents)
            ]
            if self.reward_processor is not None:
                per_agent = [apply_processor(self.reward_processor, r) for r in per_agent]
        level.rewards = torch.stack(per_agent, dim=1).view(nodes, level.samples, -1).cpu()

    def _process_rewards(self, rewards_per_func: torch.Tensor, mode: str, prefix: str = "") -> torch.Tensor:
        """The joint reward of each scored tuple (the weighted sum of the functions' rewards, then the reward
        processor), NaN where no function scored; logs it and each function's rewards under `prefix`."""
        joint = weighted_sum(rewards_per_func, self.reward_weights)
        if self.reward_processor is not None:
            joint = apply_processor(self.reward_processor, joint)
        metrics = self._metrics[mode]
        metrics[f"{prefix}reward"].append(torch.nanmean(joint).item())
        metrics[f"{prefix}reward_std"].append(nanstd(joint).item())
        for k, name in enumerate(self.reward_func_names):
            metrics[f"{prefix}rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[:, k]).item())
            metrics[f"{prefix}rewards/{name}/std"].append(nanstd(rewards_per_func[:, k]).item())
        return joint

    def _log_joint_samples(self, levels: list[Level], outputs: list[dict]) -> None:
        """Fill the completions table: one row per root sample (`turns.completion_rows`), gathered."""
        advantages = [output["advantages"].tolist() for output in outputs]
        for row in gather_object(
            completion_rows(levels, advantages, self.reward_func_names, self.accelerator.process_index)
        ):
            self._logs["prompt"].append(row["prompt"])
            self._logs["completion"].append(row["completion"])
            self._logs["advantages"].append(row["advantage"])
            for name, value in row["rewards"].items():
                self._logs["rewards"][name].append(value)
            for column, value in row["extra"].items():
                self._logs["extra"][column].append(value)

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, **kwargs):
        self._eval_recorder = EvalRecorder(self.num_agents) if self.record_eval_trajectories else None
        try:
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, **kwargs)
            if self._eval_recorder is not None:
                prefix = kwargs.get("metric_key_prefix", "eval")
                metrics = self.trajectory_metrics(self._eval_recorder.trajectories)
                output.metrics.update({f"{prefix}_{key}": value for key, value in metrics.items()})
        finally:
            self._eval_recorder = None
        return output

    def trajectory_metrics(self, trajectories: EvalTrajectories) -> dict[str, float]:
        """Metrics over every trajectory an evaluation played (with `record_eval_trajectories = True`), logged with
        the `eval_` prefix. None by default; subclasses compute theirs (see `multiagent_trl.rollout.evaluation`)."""
        return {}

    # ------------------------------------------------------------------ loss and optimization

    def _compute_loss(self, model, inputs):
        # One backward per agent, right after its forward (Trainer runs the last one's): it frees each
        # graph before the next forward, lets activation checkpointing recompute with the agent's own LoRA adapter
        # (switching adapters before one joint backward gives wrong gradients), and gives DDP one forward per
        # backward. DeepSpeed's engine counts backward calls as micro-steps, so there the losses are summed instead.
        separate_backward = model.training and torch.is_grad_enabled() and not self.is_deepspeed_enabled
        parts = loss_parts(inputs)  # (agent, its batch: every turn of the rollout)
        total = 0.0
        agent_losses = [0.0] * self.num_agents
        for k, (i, batch) in enumerate(parts):
            with self._agent_view(i):
                # Departure from TRL: rows that are not trained (`Rollout.masked`) must not count in a loss that
                # averages over rows, else every trained row's gradient shrinks by a factor that changes with the
                # rollout's shape. TRL's per-token loss is positively homogeneous in the advantages and `beta`, so
                # scaling both scales each row's loss and leaves the entropy bonus (a token mean) as it is.
                scale = self._trained_row_scale(len(batch["advantages"]), batch.pop("trained_rows", None))
                if scale != 1.0:
                    batch["advantages"] = batch["advantages"] * scale
                with self._swap(**self._vllm_state(), beta=self.beta * scale):
                    loss = super()._compute_loss(model, batch)
                agent_losses[i] = agent_losses[i] + loss.detach()
                if separate_backward and k < len(parts) - 1:
                    self.accelerator.backward(loss)
                    loss = loss.detach()
            total = total + loss
        if model.training and self.num_agents > 1:
            self._log_agent_losses(agent_losses)
        return total

    def _trained_row_scale(self, rows: int, trained_rows: torch.Tensor | None) -> float:
        """The factor that makes the active agent's loss count trained rows only. TRL's `grpo`, `sapo` and `luspo`
        losses average over a micro-batch's `rows` and `dr_grpo` divides by them; the factor replaces `rows` by the
        micro-batch's share of the generation batch's `trained_rows` (over all processes and steps), so that a
        trained row weighs the same whatever shares its micro-batch. 1.0 where every row is trained, for the
        token-normalized losses (`dapo`, `bnpo`, `cispo`, `vespo`: untrained rows have no tokens in the loss), and
        for a single turn (`trained_rows` is `None`)."""
        if trained_rows is None or self.loss_type not in ("grpo", "sapo", "luspo", "dr_grpo"):
            return 1.0
        steps = self.args.steps_per_generation if self.model.training else 1  # TRL splits a training batch in steps
        share = trained_rows.item() / (self.accelerator.num_processes * steps)
        return rows / share if share > 0 else 1.0

    def _log_agent_losses(self, agent_losses: list[torch.Tensor | float]) -> None:
        """Record each agent's loss of this micro-batch as `agent_{i}/loss`, on the scale of Trainer's `loss`.

        TRL's loss is already divided over the accumulation window; Trainer logs the window's sum per optimizer step
        (averaged over processes), while TRL's metrics are averaged over their entries, one per micro-batch here. So
        each entry is multiplied by the window's length: the agents' logged losses then add up to the logged `loss`.
        """
        device = self.accelerator.device
        losses = torch.stack([torch.as_tensor(loss, dtype=torch.float32, device=device) for loss in agent_losses])
        losses = self.accelerator.gather(losses[None]).mean(dim=0) * self.current_gradient_accumulation_steps  # (N,)
        for i, loss in enumerate(losses.tolist()):
            self._metrics["train"][f"agent_{i}/loss"].append(loss)

    def create_optimizer(self, model=None):
        given = self.optimizer is not None  # through `optimizers=` (or built by an earlier call)
        optimizer = super().create_optimizer(model)
        learning_rates = self.args.agent_learning_rates
        if learning_rates is None and (self.num_agents == 1 or given):
            # A user's optimizer keeps its own groups and hyperparameters, which a schedule given with it indexes;
            # per-agent clipping needs no group per agent (`_clip_grad_norm` reads each agent's parameters).
            return optimizer
        # Split each of Trainer's parameter groups (decay / no decay) into one group per agent, with its own
        # learning rate; the scheduler then scales every group's rate by the same factor.
        owner = {id(p): i for i in range(self.num_agents) for p in self.model.agent_parameters(i)}
        groups = []
        for group in optimizer.param_groups:
            for i in range(self.num_agents):
                params = [p for p in group["params"] if owner[id(p)] == i]
                if params:
                    lr = learning_rates[i] if learning_rates is not None else group["lr"]
                    groups.append({**group, "params": params, "lr": lr, "initial_lr": lr, "agent": i})
        optimizer.param_groups.clear()
        for group in groups:
            optimizer.add_param_group(group)
        return optimizer

    def _clip_grad_norm(self, model):
        if self.num_agents == 1 or self.is_deepspeed_enabled:
            return super()._clip_grad_norm(model)  # the engine clips the whole model
        self.accelerator.unscale_gradients()
        norms = []
        for i in range(self.num_agents):
            norm = sharding.clip_grad_norm_(self.model.agent_parameters(i), self.args.max_grad_norm)
            self._metrics["train"][f"agent_{i}/grad_norm"].append(norm.item())
            norms.append(norm)
        return torch.linalg.vector_norm(torch.stack(norms))  # the team's norm, logged as `grad_norm`

    # ------------------------------------------------------------------ logging

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        for i, view in enumerate(self._agent_views):
            prefix = self.agent_metric_prefix(i)
            for key, values in view["_metrics"][mode].items():
                if key == "num_tokens":  # TRL's counter is the trainer's, shared by all agents: log it once
                    self._metrics[mode][key] = values
                elif prefix or key not in self._metrics[mode]:  # a team of one: the joint values are the agent's
                    self._metrics[mode][prefix + key].extend(values)
            view["_metrics"][mode].clear()
        super().log(logs, start_time)

    # ------------------------------------------------------------------ saving and loading

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Save each agent to `output_dir/agent_{i}/` with its tokenizer: a model folder for `from_pretrained`, or
        an adapter folder for `PeftModel.from_pretrained` (plus `merged/` with `save_merged_models`)."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        for i in range(self.num_agents):
            agent_dir = os.path.join(output_dir, f"agent_{i}")
            self.model.save_agent(i, agent_dir, state_dict=state_dict, merged=self.args.save_merged_models)
            self._agent_views[i]["processing_class"].save_pretrained(agent_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if self.is_fsdp_enabled:  # the team's state as the engine saved it (all ranks load their shards)
            return sharding.load_checkpoint(self.accelerator, self.model, resume_from_checkpoint)
        for i in range(self.num_agents):
            agent_dir = os.path.join(resume_from_checkpoint, f"agent_{i}")
            if not os.path.isdir(agent_dir):
                raise FileNotFoundError(
                    f"Checkpoint {resume_from_checkpoint} has no folder agent_{i}/; it was not written by a "
                    f"MultiAgentGRPOTrainer with {self.num_agents} agents."
                )
            self.model.load_agent(i, agent_dir)

    def _save_checkpoint(self, model, trial) -> None:
        # Unlike Trainer, which writes `checkpoint-N/` in place (a process killed mid-save leaves a partial folder that
        # `train(resume_from_checkpoint=True)` picks and fails on), write it under another name and rename it once
        # complete. TRL saves one entropy controller; a team saves each agent's.
        def save_checkpoint(model, trial):
            super(MultiAgentGRPOTrainer, self)._save_checkpoint(model, trial)
            if self.use_adaptive_entropy and self.args.should_save:
                folder = os.path.join(
                    self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
                )
                save_entropy_states(self._agent_views, folder)

        save_atomically(self, save_checkpoint, model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self.use_adaptive_entropy and checkpoint is not None:
            load_entropy_states(self._agent_views, checkpoint)

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        *,
        repo_id: str | None = None,
        single_repo: bool = False,
        dataset_name: str | None = None,
        tags: Sequence[str] = (),
        **kwargs,
    ) -> list[str]:
        """Push every agent to the Hub, each with a model card (see `hub.push_team`): one repo per agent,
        `<repo_id>-agent-{i}`, or with `single_repo=True` one repo `repo_id` with `agent_i/` folders. `repo_id`
        defaults to `args.hub_model_id`, else the name of `output_dir`. Returns the repos' URLs. (Trainer's pushes one
        folder to one repo; `blocking` is accepted for its signature, the uploads always finish before returning.)"""
        message = commit_message or "End of training"
        return hub.push_team(self, repo_id, single_repo, message, private, token, revision, dataset_name, tags)
