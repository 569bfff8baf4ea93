"""`MultiAgentGRPOTrainer`: TRL's `GRPOTrainer`, run for N agents on one joint reward (MAGRPO).

One generation batch (`_generate_and_score_completions`), turn by turn (`_play`): (1) each agent formats the rows
into its own prompts and generates G completions per prompt, independently; (2) the joint reward functions score
tuples of completions (the aligned tuples, or all G^N in `joint_mode="cross"`), credited back to each completion
(over a multi-turn rollout, as returns); (3) TRL's own `_generate_and_score_completions` runs in each agent's *view*
(its tokenizer, generation config, reference model, metrics), replaying steps 1 and 2, so TRL computes the
advantages, log-probs and metrics exactly as for one GRPO policy. The loss is each agent's own TRL GRPO loss.
"""

from __future__ import annotations

import collections
import copy
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from datasets import Dataset, IterableDataset
from peft import PeftConfig
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from . import hub
from .common import per_agent
from .config import MultiAgentGRPOConfig, team_config
from .rewards.advantages import local_baseline_advantages
from .rewards.joint import (
    bind_reward_funcs,
    flush_reward_logs,
    pop_agent_rewards,
    weighted_sum,
)
from .rewards.models import check_model_rewards
from .rewards.scoring import joint_reward, joint_samples, level_rewards, turn_credit
from .rollout.buffers import check_fills_a_batch, covering
from .rollout.episode import EpisodeBatch, episode_batch, trained_row_scale
from .rollout.evaluation import EvalRecorder, EvalTrajectories, greedy_decoding
from .rollout.generation import configure_decoding
from .rollout.logprob_kernel import use_faster_cpu_kernel
from .rollout.replay import Replay, Rollout, loss_parts
from .rollout.tree import Level, Node, continued_rows, link, next_level, padded, paths, root_level
from .rollout.turns import Transition, add_completion_rows, completion_rows, formatted_rows, turn_prefix
from .team import sharding
from .team.arguments import check_callables, check_prompt_column
from .team.checkpointing import load_team_folders, save_atomically, save_team
from .team.folders import check_checkpoint
from .team.loading import load_team, reference_copies
from .team.modules import AgentTeam, LoraAgentTeam
from .team.optim import ParameterGroup, check_finite_loss, logged_losses, split_by_owner, warn_owners_left_out
from .team.placement import place_agents
from .team.reference_sync import ReferenceSyncCallback
from .team.views import (
    agent_views,
    load_entropy_states,
    merge_agent_metrics,
    same_generation_settings,
    save_entropy_states,
    swapped,
)
from .team.views import (
    metrics_aside as agent_metrics_aside,
)
from .tools.environments import REPLAY_STATE, TOOL_HOST_STATE, TOOL_STATE, TeamTools
from .vllm import team_generator


class MultiAgentGRPOTrainer(GRPOTrainer):
    """Train N language-model agents with GRPO on one joint reward.

    A drop-in replacement for `trl.GRPOTrainer`: same arguments, same reward-function conventions, same launch
    commands; with one agent it trains exactly like `GRPOTrainer`. CoMLRL's argument names are
    `MAGRPOTrainer`'s.

    What differs from `GRPOTrainer`, and why:

    - `_generate_and_score_completions`: the agents play the rollout, the joint reward is computed once per turn,
      and TRL's own method runs per agent on the credited rewards (see the module docstring).
    - `_generate`, `_generate_single_turn`, `_calculate_rewards`: replay what was computed jointly inside the
      per-agent pass (`rollout.replay.Replay`).
    - `_compute_loss`: each agent's own GRPO loss, one backward per agent (logged as `agent_{i}/loss`); untrained
      rows of a multi-turn batch do not count in losses that average over rows.
    - `create_optimizer`, `_clip_grad_norm`: a parameter group per agent (its learning rate) and clipping per agent.
    - `log`, `_save`, `_load_from_checkpoint`, `_load_best_model`, `_save_checkpoint`, `push_to_hub`: per-agent
      metrics (`agent_{i}/...`), folders (`agent_{i}/`, each loadable with `from_pretrained`, and what
      `load_best_model_at_end` loads), atomic checkpoints, repos.

    Which of TRL's attributes are each agent's own is listed, with the reason, in `multiagent_trl.team.views`.

    Args:
        model (`str`, `PreTrainedModel`, or a list of them):
            One model id or path (loaded `args.num_agents` times), one model, or one model or id per agent (sizes and
            architectures may differ).
        reward_funcs (callable or list of callables):
            Joint rewards, CoMLRL style `f(completions1, ..., completionsN)` or TRL style `f(prompts, completions,
            **kwargs)` (`completions[j]`: the agents' completions of joint sample j), weighted by
            `args.reward_weights`; TRL's reward models score the text `joint_text` builds (`rewards.models`).
        args (`MultiAgentGRPOConfig`, *optional*): Configuration; `None` uses the defaults.
        train_dataset, eval_dataset (`datasets.Dataset`, *optional*):
            Rows with a `"prompt"` column, unless `formatters` builds the prompts; other columns reach the rewards.
        processing_class (tokenizer, or one per agent, *optional*): Loaded from each agent's model when `None`.
        callbacks, optimizers: As in `transformers.Trainer`.
        reward_processor (`Callable[[float], float]`, *optional*):
            Applied to each joint reward before advantages, e.g. `RewardProcessors.scale(100.0)`.
        peft_config (`PeftConfig`, or one per agent, *optional*):
            With one base: one adapter per agent (`agent_0`, ...) on a shared, frozen base. With a list of models:
            an adapter on each.
        formatters (callable or one per agent, *optional*): `formatter(row) -> prompt` (text or conversation).
        external_transition (callable, *optional*):
            Needed when `args.num_turns > 1`: `external_transition(row, histories, turn) -> prompts`, each agent's
            prompt for the next turn (CoMLRL's keyword convention works too; see `rollout.turns`).
        joint_text (callable, *optional*):
            `joint_text(prompts, completions) -> str`, the text reward models score from one joint sample (`None`:
            `rewards.models.default_joint_text`).
        **kwargs: Other `GRPOTrainer` arguments (`reward_processing_classes`, `quantization_config`, ...).

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
    # True: each epoch's last generation batch is completed from the start of the epoch's order, so that every item is
    # trained each epoch (`rollout.buffers`), as buffer-filling trainers need; False: TRL's sampler, which drops it.
    covers_every_item = False

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
        args = team_config(model, args)
        sharding.check_launch(args)  # before loading models: every launched process must be in the run

        # 1. The agents: one base with one adapter per agent, or one model per agent.
        loaded = load_team(
            model, args, peft_config, processing_class, kwargs.get("quantization_config"), optimizers[1]
        )
        models, processing_classes, shared_base = loaded.models, loaded.processing_classes, loaded.shared_base
        num_agents, betas = loaded.num_agents, loaded.betas
        team_tools = TeamTools.from_arguments(kwargs, num_agents, args)  # a team's tools go to the agents' views
        if num_agents > 1 and args.ddp_find_unused_parameters is None:
            # Each agent's forward and backward leaves the other agents' parameters unused (DDP must be told).
            args.ddp_find_unused_parameters = True

        # 2. How the agents see the task, and how their answers are scored.
        self.formatters = per_agent("formatters", formatters, num_agents)
        check_callables(self.formatters, reward_processor, external_transition, args.num_turns)
        self.external_transition, passthrough = external_transition, args.external_prompt_passthrough
        self._transition = (
            Transition(external_transition, self.formatters, passthrough) if external_transition else None
        )
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            check_prompt_column(name, dataset, self.formatters)
        classes = kwargs.get("reward_processing_classes")
        reward_funcs, kwargs["reward_processing_classes"] = bind_reward_funcs(
            reward_funcs, num_agents, classes, args, joint_text, self.rewards_per_sample
        )
        self.reward_processor = reward_processor

        # 3. TRL sets up agent 0 as its policy, with agent 0's per-agent settings. It must not build a reference model
        # (it would reload one from the model's path, which an in-memory model lacks, or add a second `ref` adapter):
        # beta is hidden from it, and each agent's reference comes from `reference_copies` or its adapters; so is
        # `sync_ref_model` (each agent's reference is synced by `reference_sync.ReferenceSyncCallback`).
        ref_models = reference_copies(models, betas[: len(models)])  # one model only on a shared base
        # TRL's own vLLM backend is for one policy (it syncs a PEFT one by merging it): the team has its own engines.
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

        # 4. Each agent's own state (see `team.views`), then "the model" that Trainer and Accelerate see: the team.
        if shared_base:
            models, ref_models = models * num_agents, ref_models * num_agents
            processing_classes = [self.processing_class] * num_agents
        self._agent_views = agent_views(self, models, processing_classes, ref_models, shared_base)
        self._team_tools = team_tools
        self._install_tools()
        # `compile_generation`, the sampling warpers (`rollout.sampling`)
        self.generation_config = configure_decoding(self._agent_views, models, args)
        use_faster_cpu_kernel()  # TRL's log-prob kernel on CPUs: the same bits, faster (`logprob_kernel`)
        team = (
            LoraAgentTeam(models[0], [f"agent_{i}" for i in range(num_agents)]) if shared_base else AgentTeam(models)
        )
        if sharding.is_fsdp2(self.accelerator):
            team = sharding.shard_team(team, self.accelerator)  # each agent's layers are its own FSDP units
        elif self.place_model_on_device and not self.is_model_parallel:
            self._move_model_to_device(team, self.args.device)
        if args.agent_devices is not None:
            refs = [view.get("ref_model") for view in self._agent_views]
            place_agents(
                team, refs, args.agent_devices, args.reference_devices, self.accelerator.device, args.world_size
            )
            self.is_model_parallel, self.place_model_on_device = True, False  # the agents stay where they were put
        self.model = self.model_wrapped = self.callback_handler.model = team
        self._replay, self._eval_recorder = None, None  # `Replay` in an agent's pass; `EvalRecorder` in evaluation
        self._agent_rewards: torch.Tensor | None = None  # (rows, F, N): the last joint pass's per-agent rewards
        self._first_train_row: dict | None = None  # a model card's example (`hub.example_row`): a stream has no row 0
        self._staging_dir: str | None = None  # while a checkpoint is staged (`_save_checkpoint`): Trainer's run dir
        if args.sync_ref_model:
            self.add_callback(ReferenceSyncCallback(self.accelerator, self._agent_views))
        self._vllm = None  # the team's vLLM engines or servers (`use_vllm=True`), synced at `_vllm_step`
        if args.use_vllm:
            self._vllm = team_generator(team, args, processing_classes, team_tools.rollout_funcs)
            self._vllm_step = self.state.global_step

    def create_accelerator_and_postprocess(self) -> None:
        # FSDP runs on CPU too (gloo), and a requested engine that is not set up is an error, not a fallback.
        with sharding.fsdp_on_cpu(self.args):
            super().create_accelerator_and_postprocess()
        sharding.check_engine(self.accelerator, self.args)

    def _install_tools(self) -> None:
        """Give every agent's view its tools and environments (`tools.TeamTools.install`), and add what they need."""
        names = (*TOOL_STATE, *TOOL_HOST_STATE)  # TRL sets some only per batch; the agent views swap them all
        state = {name: getattr(self, name, None) for name in names}
        for name, value in self._team_tools.install(self._agent_views, state, self.args).items():
            setattr(self, name, value)

    def _swap(self, **attributes):
        return swapped(self, **attributes)

    # Public seams: what the families, the hub and the CoMLRL layer use of the team core (`TeamTrainer`).

    @property
    def first_train_row(self) -> dict | None:
        """The first row this trainer trained on (a model card's example for a streamed dataset, which has no row 0),
        or `None` before the first training batch."""
        return self._first_train_row

    @property
    def model_tags(self) -> list[str]:
        """The tags added to every agent's model card (TRL's `_tag_names` of this trainer class)."""
        return list(self._tag_names)

    def set_transition(self, transition: Callable[[Node, list], list]) -> None:
        """Make later-turn prompts with `transition(node, sample) -> prompts` (one per agent) instead of the one built
        from `external_transition` and `formatters` (`rollout.turns.Transition`); for instance
        `rollout.turns.FormattedTransition`, which passes each returned prompt through the agent's formatter as the
        row's `prompt` (CoMLRL's actor-critic convention)."""
        if not callable(transition):
            raise TypeError(f"`transition` must be a callable `(node, sample) -> prompts`; got {type(transition)}.")
        self._transition = transition

    def sample(self, rows: list[dict], num_generations: int) -> Level:
        """One turn of joint candidates, outside a training step: each agent formats `rows` into its own prompts
        (`formatters`) and samples `num_generations` completions per row with its training sampling settings, and the
        reward functions score the `num_generations` aligned joint samples of each row (weighted, after the
        `reward_processor`, as in training).

        Returns the played `rollout.tree.Level`: `level.rollouts[i]` holds agent i's completions (row n's at
        `n * num_generations ...`), `level.joint` the joint rewards gathered over the processes, `level.nodes` this
        process's rows. Collective: every process calls it (with its own rows). Metrics it records go to the
        training logs unless the call is inside `metrics_aside()`.
        """
        inputs = [row for row in rows for _ in range(num_generations)]  # each row G times, as TRL's sampler hands them
        agent_inputs = [self._agent_inputs(inputs, i) for i in range(self.num_agents)]
        with self._swap(num_generations=num_generations):
            return self._play(inputs, agent_inputs, num_generations, "train")[0]

    @contextmanager
    def metrics_aside(self) -> Iterator[dict[str, dict[str, list]]]:
        """Inside the block, the team's and every agent's metrics are recorded into fresh dicts (the team's yielded,
        `{"train": ..., "eval": ...}`), so that sampling outside a training step (`sample`) leaves the next
        training log untouched; the trainer's own metrics come back after it."""
        fresh = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
        with self._swap(_metrics=fresh), agent_metrics_aside(self._agent_views):
            yield fresh

    def weights_changed(self) -> None:
        """Say that the agents' weights changed outside an optimizer step (loaded from a checkpoint, or another
        model's swapped in for a comparator's draw): with `use_vllm=True` the engines take them before their next
        generation, which otherwise syncs only when `global_step` moved."""
        self._vllm_step = None

    def add_metrics(self, metrics: dict[str, list[float]], mode: str = "train") -> None:
        """Record `metrics` (name -> values) for the next `mode` log, where each name's values are averaged with what
        else is recorded for it by then (TRL's metrics convention)."""
        for name, values in metrics.items():
            self._metrics[mode][name].extend(values)

    @contextmanager
    def _agent_view(self, index: int) -> Iterator[None]:
        """Run TRL code as if agent `index` were the only policy: its `team.views.PER_AGENT` values are swapped in
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

    def loss_name(self, kind: str, index: int) -> str:
        """How an error names agent `index`'s loss of `kind` ("policy loss", "DPO loss"): with its logged metric."""
        return f"{kind} of agent {index} (`{self.agent_metric_prefix(index)}loss`)" if self.num_agents > 1 else kind

    def _agent_inputs(self, inputs: list[dict], index: int) -> list[dict]:
        return formatted_rows(inputs, self.formatters[index] if self.formatters else None, index)

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
        agent_inputs = [
            self._agent_inputs(inputs, i) for i in range(self.num_agents)
        ]  # environments reset, tools bound:
        agent_inputs, environments = self._team_tools.begin_batch(self._agent_views, inputs, agent_inputs)
        self.environments = environments if environments is not None else getattr(self, "environments", None)
        levels = self._play(inputs, agent_inputs, width, mode)  # steps 1 and 2, turn by turn

        if self.args.num_turns == 1:
            # 2b. Credit each agent's completions with the joint reward (TRL weighs and normalizes the functions'
            # rewards itself, unless a processor applies to their sum first).
            level, names, weights = levels[0], self.reward_func_names, self.reward_weights
            processor, reduction = self.reward_processor, self.args.cross_credit
            credited, names, weights = turn_credit(level, self._agent_rewards, processor, names, weights, reduction)
            batch = EpisodeBatch(level.agent_rows, level.rollouts, credited, trained_rows=None)  # every row trained
        else:
            # 2b. Returns over the rollout, each row credited with its own (or, in cross mode, its tuples').
            batch = episode_batch(levels, self.args, self.num_agents, mode, self.accelerator, self._metrics[mode])
            names, weights = ["return"], torch.ones(1)

        # 3. TRL's own scoring per agent: advantages, old/ref log-probs, metrics.
        outputs = self._score_agents(batch, names, weights)
        self._log_joint_samples(levels, outputs)
        for output in outputs if batch.trained_rows is not None else ():  # for `_compute_loss` (`trained_row_scale`)
            output["trained_rows"] = batch.trained_rows
        return {f"agent_{i}/{key}": value for i, output in enumerate(outputs) for key, value in output.items()}

    def _play(self, inputs: list[dict], agent_inputs: list[list[dict]], width: int, mode: str) -> list[Level]:
        """Play the turns (`rollout.tree`): each turn's nodes generate in one call and are scored in one call."""
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
                sources = continued_rows(levels[-1], level)
                environments = self._team_tools.begin_turn(self._agent_views, sources, branch=level.width > 1)
                self.environments = environments if environments is not None else self.environments
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
        return int(self.accelerator.gather(torch.tensor([count], device=self.accelerator.device)).max())

    def _get_train_sampler(self, dataset: Dataset | None = None):
        sampler = super()._get_train_sampler(dataset)
        sampler = covering(sampler) if self.covers_every_item else sampler
        if len(sampler) == 0:
            check_fills_a_batch(len(sampler.data_source), sampler.batch_size)
        return sampler

    def _rollouts(self, agent_inputs: list[list[dict]], mode: str) -> list[Rollout]:
        """Every agent generates from its rows' prompts (one `generate` call for all agents in batched mode)."""
        prompts = [[row["prompt"] for row in rows] for rows in agent_inputs]
        greedy = mode == "eval" and not self.args.eval_do_sample
        with (
            greedy_decoding(self._agent_views, greedy),
            self._swap(generation_config=self._agent_views[0]["generation_config"]),
        ):
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
        """TRL's `use_vllm`, on with the team's engines: TRL then corrects each agent's loss for vLLM's log-probs."""
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
        rows, sampling = [None] * self.num_agents, [None] * self.num_agents
        for i, ids in prompt_ids.items():  # each agent's settings, greedy in evaluation if asked
            extra = self.args.agent_setting("generation_kwargs", i)
            rows[i], sampling[i] = ids, AgentSampling.from_view(self._agent_views[i], extra)
        return self._vllm.generate(rows, sampling)

    def _batched_generation(self) -> bool:
        return (
            self.args.generation_mode == "batched"
            and self.model.batches_generation()
            and same_generation_settings(self._agent_views)  # else one at a time (a LoRA team logs it at __init__)
        )

    def _generate_batched(self, prompts: list[list]) -> list[list[list[int]]]:
        """Generate for all agents in one `generate` call (`team.mixed_batch`): completion ids per agent."""
        prompt_ids = self._tokenize_agents(prompts)
        with self.model.mixed_batch([len(ids) for ids in prompt_ids]):
            completion_ids, _ = super()._generate_single_turn(
                [ids for agent_ids in prompt_ids for ids in agent_ids], None, {}, self.num_generations
            )
        bounds = torch.tensor([0] + [len(ids) for ids in prompt_ids]).cumsum(0).tolist()
        return [completion_ids[start:end] for start, end in zip(bounds[:-1], bounds[1:])]

    def _score_agents(self, batch: EpisodeBatch, names, weights) -> list[dict[str, Any]]:
        """TRL's `_generate_and_score_completions` once per agent, replaying its rollout and credited rewards."""
        outputs, credited = [], batch.credit
        for i in range(self.num_agents):
            replay = Replay(rollout=batch.rollouts[i], rewards=credited[i])
            # TRL reads the number of reward functions from `reward_funcs`; it must match the replayed columns.
            swapped = dict(
                _replay=replay, reward_func_names=names, reward_weights=weights, reward_funcs=[None] * len(names)
            )
            swapped.update(**REPLAY_STATE, **self._vllm_state())  # the environments and tools were used in step 1
            with self._agent_view(i), self._swap(**swapped):
                outputs.append(super()._generate_and_score_completions(batch.agent_rows[i]))
            if self.args.advantage_baseline != "mean":  # TRL computed GRPO's; replace them with the baseline's
                group = self.num_generations if self.model.training else self.num_generations_eval
                rewards, process = weighted_sum(credited[i], weights), self.accelerator.process_index
                outputs[-1]["advantages"] = local_baseline_advantages(
                    rewards,
                    group,
                    self.args.advantage_baseline,
                    self.scale_rewards,
                    process,
                    self.accelerator.num_processes,
                )
        return outputs

    def _joint_rewards(self, level: Level, mode: str, turn: int | None = None) -> None:
        """Score the level's joint samples with every reward function, in one call; fills `level.rewards_per_func`,
        `level.joint` (gathered), `level.rewards` (this process's) and `level.extras` (`rewards.scoring`)."""
        rows, prompts, completions, completion_ids = joint_samples(level, self.reward_funcs)
        rewards = self._calculate_rewards(rows, prompts, completions, completion_ids)
        prefix, metrics = "" if turn is None else turn_prefix(turn), self._metrics[mode]
        pending, extra = self._pending_metrics, self._pending_extra_logs
        level.extras = flush_reward_logs(pending, extra, metrics, self.accelerator, prefix, len(rows))
        scored = gather(level.scored().repeat_interleave(level.samples).to(rewards.device))
        rewards[~scored] = math.nan  # placeholders are not scored
        # Where functions scored each agent on its own.
        self._agent_rewards = pop_agent_rewards(self.reward_funcs, rewards, self.num_agents, self.accelerator)
        level.rewards_per_func = rewards
        processor, weights = self.reward_processor, self.reward_weights
        level.joint = joint_reward(rewards, weights, processor, self.reward_func_names, metrics, prefix)
        local = slice(self.accelerator.process_index * len(rows), (self.accelerator.process_index + 1) * len(rows))
        agent_rewards = self._agent_rewards[local] if self._agent_rewards is not None else None
        level.rewards = level_rewards(level.joint[local], agent_rewards, weights, processor, level)

    def _log_joint_samples(self, levels: list[Level], outputs: list[dict]) -> None:
        """Fill the completions table: one row per root sample (`turns.completion_rows`), gathered."""
        advantages = [output["advantages"].tolist() for output in outputs]
        rows = completion_rows(levels, advantages, self.reward_func_names, self.accelerator.process_index)
        add_completion_rows(self._logs, gather_object(rows))

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
                steps = (self.args.steps_per_generation if model.training else 1) * self.accelerator.num_processes
                scale = trained_row_scale(
                    self.loss_type, len(batch["advantages"]), batch.pop("trained_rows", None), steps
                )
                if scale != 1.0:
                    batch["advantages"] = batch["advantages"] * scale
                with self._swap(**self._vllm_state(), beta=self.beta * scale):
                    loss = super()._compute_loss(model, batch)
                if model.training and torch.is_grad_enabled():
                    step = self.state.global_step + 1
                    check_finite_loss(loss, self.loss_name("policy loss", i), step, self.accelerator)
                agent_losses[i] = agent_losses[i] + loss.detach()
                if separate_backward and k < len(parts) - 1:
                    self.accelerator.backward(loss)
                    loss = loss.detach()
            total = total + loss
        if model.training and self.num_agents > 1:
            losses = logged_losses(agent_losses, self.accelerator, self.current_gradient_accumulation_steps)
            for i, loss in enumerate(losses):
                self._metrics["train"][f"agent_{i}/loss"].append(loss)
        return total

    def _parameter_groups(self) -> list[ParameterGroup]:
        """What the optimizer and the clipping treat apart: each agent's parameters (a subclass adds its own)."""
        lrs = self.args.agent_learning_rates or [None] * self.num_agents
        owned = [self.model.agent_parameters(i) for i in range(self.num_agents)]
        return [
            ParameterGroup(p, lr, f"agent_{i}/grad_norm", {"agent": i}) for i, (p, lr) in enumerate(zip(owned, lrs))
        ]

    def create_optimizer(self, model=None):
        # Trainer takes the parameters that require gradients: a LoRA team's adapters, frozen by PEFT in a pass under
        # `no_grad` before `train()` (an evaluation, an adapter critic's values), would be left out.
        self.model.keep_adapters_trainable()
        given = self.optimizer is not None  # through `optimizers=` (or built by an earlier call)
        optimizer, groups = super().create_optimizer(model), self._parameter_groups()
        warn_owners_left_out(optimizer, groups)
        if all(group.lr is None for group in groups) and (len(groups) == 1 or given):
            return optimizer  # a user's optimizer keeps its groups, which a schedule given with it indexes
        return split_by_owner(optimizer, groups)

    def _clip_grad_norm(self, model):
        groups = self._parameter_groups()
        if len(groups) == 1 or self.is_deepspeed_enabled:
            return super()._clip_grad_norm(model)  # the engine clips the whole model
        self.accelerator.unscale_gradients()
        norms = [sharding.clip_grad_norm_(group.params, self.args.max_grad_norm) for group in groups]
        for group, norm in zip(groups, norms):
            self._metrics["train"][group.metric].append(norm.item())
        return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))  # logged as `grad_norm`

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        prefixes = [self.agent_metric_prefix(i) for i in range(self.num_agents)]
        merge_agent_metrics(self._agent_views, self._metrics[mode], mode, prefixes)
        super().log(logs, start_time)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Save each agent to `output_dir/agent_{i}/` with its tokenizer (`team.checkpointing.save_team`)."""
        if self.args.should_save:
            tokenizers = [view["processing_class"] for view in self._agent_views]
            save_team(self.model, tokenizers, output_dir or self.args.output_dir, state_dict, self.args)

    def shared_folders(self) -> dict[str, str]:
        """What `save_model` writes beside the agents' folders for the team (folder name -> what it is, in words),
        which `push_to_hub` uploads and describes with them: nothing here (a subclass adds its own)."""
        return {}

    def checkpoint_model_folders(self) -> list[str]:
        """The model folders a checkpoint of this trainer holds, relative to it: `agent_{i}` (a subclass adds its
        own, such as critics)."""
        return [f"agent_{i}" for i in range(self.num_agents)]

    def checkpoint_files(self, folder: str) -> list[str]:
        """More files (relative) that the checkpoint `folder` must hold beside its model folders and the training
        state (a subclass adds its own)."""
        return []

    def check_checkpoint(self, folder: str) -> None:
        """Refuse a damaged checkpoint before any of it is loaded: every model folder's weights, the optimizer,
        scheduler and RNG states (together), `trainer_state.json` and every other saved file there, present and
        readable (`team.folders.check_checkpoint`). Raises `FileNotFoundError` or `ValueError` naming the file."""
        engine = self.is_fsdp_enabled or self.is_deepspeed_enabled  # the engine's own layout of weights and state
        check_checkpoint(
            folder,
            model_folders=[] if engine else self.checkpoint_model_folders(),
            required=self.checkpoint_files(folder),
            process_index=self.args.process_index,
            world_size=self.args.world_size,
            engine_state=engine,
        )

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        # Checked whole first: loading file by file would overwrite some weights before failing on a damaged file.
        self.check_checkpoint(resume_from_checkpoint)
        if self.is_fsdp_enabled:  # the team's state as the engine saved it (all ranks load their shards)
            sharding.load_checkpoint(self.accelerator, self.model, resume_from_checkpoint)
        else:
            load_team_folders(self.model, resume_from_checkpoint, self.num_agents)
        self.weights_changed()  # a best model loaded after the last step is not the engines' yet

    def _load_best_model(self) -> None:
        # `load_best_model_at_end`: Trainer looks for one weights file in the best checkpoint and, finding none, warns
        # and keeps the last weights. A team's are per agent (a family's critics beside them): load them as a resume.
        if self.is_deepspeed_enabled:
            return super()._load_best_model()
        self._load_from_checkpoint(self.state.best_model_checkpoint)

    def _save_checkpoint(self, model, trial) -> None:
        # Unlike Trainer, which writes `checkpoint-N/` in place (a process killed mid-save leaves a partial folder that
        # `train(resume_from_checkpoint=True)` picks and fails on), write it under another name and rename it once
        # complete (`team.checkpointing`). TRL saves one entropy controller; a team saves each agent's.
        run_dir = self._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"

        def save_into(staging: str) -> None:
            self._staging_dir = staging
            try:
                super(MultiAgentGRPOTrainer, self)._save_checkpoint(model, trial)
                if self.use_adaptive_entropy and self.args.should_save:
                    save_entropy_states(self._agent_views, os.path.join(staging, name))
            finally:
                self._staging_dir = None

        save_atomically(run_dir, self.args, self.accelerator, self.state, save_into)
        if self.args.push_to_hub:
            self._push_from_checkpoint(os.path.join(run_dir, name))

    def _get_output_dir(self, trial=None) -> str:
        # While a checkpoint is staged, Trainer's save writes into the staging folder (`_save_checkpoint`).
        return self._staging_dir if self._staging_dir is not None else super()._get_output_dir(trial=trial)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        if self._staging_dir is None:  # a staged checkpoint is pushed once published, from its final folder
            super()._push_from_checkpoint(checkpoint_folder)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self.use_adaptive_entropy and checkpoint is not None:
            load_entropy_states(self._agent_views, checkpoint)

    push_to_hub = hub.push_to_hub  # every agent, each with its model card (`hub.push_to_hub`)
