"""Sample efficiency of multiagent_trl vs the reference library CoMLRL on the story length-ratio task.

Both libraries train the same two agents (the tiny random Qwen2 of `multiagent_trl.testing.tiny_model_path()`, both
agents starting from the same weights) on the same 10 prompts and joint reward as `examples/story-len-ratio.py`, with
the same learning rate, num_generations, max_new_tokens, sampling (temperature/top_p/top_k), prompts per optimizer
step and epochs. Each library runs in a subprocess under its own interpreter, since CoMLRL lives in its own venv:

    python3 -m venv /tmp/comlrl-venv
    /tmp/comlrl-venv/bin/pip install torch==2.13.0 comlrl==1.4.3 transformers==5.24.0 datasets

Run it (offline, about 10 minutes on 2 CPU cores) from the repository root, with the project's venv active:

    HF_HUB_OFFLINE=1 python benchmarks/compare_comlrl.py --comlrl-python /tmp/comlrl-venv/bin/python

(The dev extra installs comlrl==1.4.3 beside this library, so `--comlrl-python .venv/bin/python` works as well.)
The multi-turn task (`--num-turns 2`): turn 2's prompt tells both agents the lengths they wrote and the target
ratio; both libraries play CoMLRL's tree with no early termination, so they train on the same number of samples
(G + G*G joint samples per prompt), and the report gives each turn's reward per epoch, the reward calls per prompt
and the times:

    HF_HUB_OFFLINE=1 python benchmarks/compare_comlrl.py --comlrl-python .venv/bin/python --num-turns 2 \
        --num-generations 4 --epochs 6 --seeds 0 1 --advantage-modes mean \
        --json-out results.json --figure docs/figures/comlrl-multiturn.png

`--figure PATH` draws the joint reward against the samples seen, per library and turn (benchmarks/figures.py, which
also redraws it from the `--json-out` file: `python benchmarks/figures.py comlrl results.json PATH`).

`--jobs` runs (default 2) train at once, each with `--threads` torch threads (default: CPU count / jobs), CoMLRL's
(the slower) first. On a shared machine wall times vary with the load; the CPU time of each run varies less.

Every joint reward either library computes is recorded (for CoMLRL by wrapping its reward function; for
multiagent_trl from `trainer.state.log_history['reward']` with `logging_steps=1`, cross-checked against the same
wrapper). The table gives the mean scaled joint reward (x100) against the number of samples (completions generated
per agent) seen so far, averaged over seeds, then the area under the curve (the mean reward over all samples), the
final reward, the samples needed to reach `--threshold`, and CPU and wall times.

The actor-critic family (`--family ac`): IAC and MAAC (`--trainers iac maac`, one comparison each),
CoMLRL 1.4.3's own `IACTrainer`/`MAACTrainer` (`comlrl.trainers.actor_critic`) against this library's CoMLRL layer
(`multiagent_trl.IACTrainer`/`MAACTrainer`), both built by one function (`ac_trainer`) in which only the import
differs. Both get the same agents, the same critics (`--critic seed1`: the tiny model with other random weights,
`tiny_model_path(seed=1)`, one per agent for IAC and one joint critic for MAAC; `--critic agent`: the agents' model),
one learning rate for actors and critics (`--critic-learning-rate` to differ), `--value-loss-coef` (0.6, CoMLRL's),
`--critic-type` (v), `rollout_buffer_size` = `--rollout-buffer-size` prompts x G completions (x turns: CoMLRL's
buffer counts every turn's sample) with one optimizer step per buffer (`train_batch_size=None`), the same sampling,
advantage normalization, no evaluation and no early termination (`early_termination_threshold=None`: every episode
plays every turn, so both train on the same samples). The rewards are recorded by the same wrapper (CoMLRL's
actor-critic trainers keep no log; ours' logged step means are cross-checked against it). Run each training on one
torch thread (`--threads 1`): on the tiny model a second thread only adds synchronization, and on a loaded machine
its spin-waits inflate the CPU time as well. Single turn (18 minutes on 2 shared cores), then two turns (11 minutes),
where an episode continues one completion per prompt (`--num-generations 1`, as CoMLRL requires):

    HF_HUB_OFFLINE=1 python benchmarks/compare_comlrl.py --comlrl-python .venv/bin/python --family ac \
        --trainers iac maac --jobs 1 --threads 1 --json-out ac.json
    HF_HUB_OFFLINE=1 python benchmarks/compare_comlrl.py --comlrl-python .venv/bin/python --family ac \
        --trainers iac maac --num-turns 2 --num-generations 1 --epochs 40 --jobs 1 --threads 1 --json-out ac2.json

`--ours-api native` runs ours through `ActorCriticTrainer`/`ActorCriticConfig` instead: the same settings and
CoMLRL's optimizer, but TRL's loss as configured by default (log-probs of logits / temperature, TRL's `loss_type`).
What the CoMLRL layer does differently on purpose (`multiagent_trl/comlrl/actor_critic.py`): MAAC's critic takes one
optimizer step per buffer on the mean of the agents' value losses (CoMLRL: one step per agent), a multi-turn buffer
trains all its turns in one step (CoMLRL: one step per turn), the end-of-sequence token is always scored.

The preference family (`--family preference`): MADPO and MARLHF (`--trainers madpo marlhf`, the default
there), CoMLRL 1.4.3's own `MADPOTrainer`/`MARLHFTrainer` (`comlrl.trainers.preference`) against this library's
CoMLRL-compatible classes (`from multiagent_trl import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer`), both
built by one function (`preference_trainer`) with the same arguments: the same agent objects, K =
`--preference-num-candidates` joint candidates per prompt, `--preference-pairs-per-sample` pairs per prompt
(`reward_gap`), 2 prompts per generation batch, the task reward (x100) through the same recording wrapper, no
evaluation during training. The measure is the joint task reward of the agents after `train()` on 10 held-out prompts
(`HELDOUT_PROMPTS`): `--eval-samples` sampled joint completions per prompt, with the training sampling settings and a
fixed random stream, by one function (`heldout_rewards`) for both libraries' agents; the initial agents are scored the
same way first (identical in both, a check). Also reported: the task reward of the samples drawn in `train()`, agent
0's optimizer steps and the CPU and wall time of `train()`.

- MADPO: CoMLRL draws all K candidates per prompt once from the initial agents and trains `--epochs` passes over the
  pairs (`train_batch_size=--preference-train-batch-size` pairs per step). Ours draws each generation batch's
  candidates from the current agents: one pass over the prompts (`num_train_epochs=1`) draws as many candidates as
  CoMLRL, and `num_iterations=--epochs` trains `--epochs` times on each batch's pairs, so the optimizer steps match
  when every prompt gives its `--preference-pairs-per-sample` pairs (ours counts pair slots, padding a prompt with
  fewer pairs with weight-0 rows; CoMLRL's steps hold exactly `train_batch_size` real pairs). Ours raises when a
  generation batch has no pair at all (every candidate scored the same); the worker then scores the agents as they
  are and the report says so (CoMLRL, sampling once from the initial agents, never meets such a batch).
- MARLHF: both draw the pairs once from the initial agents, train the joint reward model (`reward_model_name` = the
  tiny model's path, `reward_model_device="cpu"`: CoMLRL's default "cuda:0" fails without CUDA) for
  `--reward-num-train-epochs` epochs at `--reward-learning-rate`, then train the agents online (`rl_algorithm=
  "magrpo"`, G=`--num-generations`, `--epochs` passes) on the reward model's scores. Ours' MAGRPO-family optimizer
  is matched to CoMLRL's as below (`--ours-optimizer`); its online loss is TRL's (see below).

Small settings, one run at a time on one thread (about 2.5 and 3.5 minutes for the 12 runs on 2 shared cores;
docs/benchmarks.md also has the first with `--learning-rate 3e-4`):

    HF_HUB_OFFLINE=1 python benchmarks/compare_comlrl.py --comlrl-python .venv/bin/python --family preference \
        --trainers madpo marlhf --epochs 8 --num-generations 4 --jobs 1 --threads 1 --json-out pref.json
    HF_HUB_OFFLINE=1 python benchmarks/compare_comlrl.py --comlrl-python .venv/bin/python --family preference \
        --trainers madpo marlhf --preference-num-candidates 32 --preference-pairs-per-sample 8 --epochs 4 \
        --num-generations 4 --jobs 1 --threads 1 --json-out pref32.json

By default the optimizer of multiagent_trl is matched to CoMLRL's plain `torch.optim.AdamW`: constant learning rate,
weight decay 0.01, no gradient clipping (`--ours-optimizer trl-default` keeps TRL's linear decay, clipping at 1.0 and
no weight decay instead). Differences that remain (not settable): CoMLRL takes the policy gradient of the untempered
log-softmax (TRL: of logits / temperature), trains on the padding after EOS and drops each completion's last token,
sums log-probs per sequence (TRL: token-level "dapo" mean; the same direction for Adam), uses the population std for
advantages (TRL: sample std), keeps the prompts in dataset order (TRL: shuffled per epoch) and is not seeded (the
worker seeds python, numpy and torch).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The task of examples/story-len-ratio.py (the CoMLRL tutorial), repeated here because the CoMLRL venv cannot
# import the example (it imports trl and multiagent_trl).
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
REWARD_SCALE = 100.0
LIBRARIES = ("multiagent_trl", "comlrl")
FAMILIES = ("magrpo", "ac", "preference")
AC_TRAINERS = ("iac", "maac")
PREFERENCE_TRAINERS = ("madpo", "marlhf")
# Held-out prompts of the same kind (never trained on): `--family preference` scores the trained agents on them.
HELDOUT_PROMPTS = [
    "Describe a library under the sea:",
    "Invent a board game for robots:",
    "Write a lullaby for a volcano:",
    "Explain how a time machine might break:",
    "Tell a joke about penguins:",
    "Describe a forest that glows at night:",
    "Create a villain who hates music:",
    "Write a scene where the sun oversleeps:",
    "Invent a new musical instrument:",
    "Design a school on the moon:",
]
DEFAULT_COMLRL_PYTHON = "/tmp/comlrl-venv/bin/python"


def proper_length_ratio_reward(completions1, completions2, target_min=2.0, target_max=3.0) -> list[float]:
    """1 when len(second) / len(first) is in [target_min, target_max], exp(-distance) outside; 0 if first is empty."""
    rewards = []
    for c1, c2 in zip(completions1, completions2):
        if len(c1) == 0:
            rewards.append(0.0)
            continue
        ratio = len(c2) / len(c1)
        if target_min <= ratio <= target_max:
            rewards.append(1.0)
        else:
            distance = target_min - ratio if ratio < target_min else ratio - target_max
            rewards.append(float(math.exp(-distance)))
    return rewards


class RecordedReward:
    """The task reward (target band 2-3), recording every raw reward it returns, in call order."""

    def __init__(self) -> None:
        self.rewards: list[float] = []

    def __call__(self, completions1, completions2) -> list[float]:
        rewards = proper_length_ratio_reward(completions1, completions2, target_min=2, target_max=3)
        self.rewards.extend(rewards)
        return rewards


HINT = "Write it again:"  # ends every turn-2 prompt


def length_hint(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """The multi-turn task's feedback (CoMLRL's keyword convention): each agent learns both lengths and the target."""
    first, second = (len(c) for c in agent_completions)
    ratio = second / max(first, 1)
    note = f"The first answer had {first} characters, the second {second} (ratio {ratio:.1f}; the target is 2 to 3)."
    return [f"{prompt}\n{note} {HINT}"] * num_agents


class TurnRecordedReward(RecordedReward):
    """The task reward for the multi-turn task, recording each reward with its turn (read from the prompt, which
    both libraries pass first: CoMLRL's `f(prompts, completions1, completions2)` convention)."""

    def __init__(self) -> None:
        super().__init__()
        self.turns: list[int] = []

    def __call__(self, prompts, completions1, completions2) -> list[float]:  # type: ignore[override]
        rewards = super().__call__(completions1, completions2)
        self.turns.extend(2 if p.endswith(HINT) else 1 for p in prompts[: len(rewards)])
        return rewards


@dataclass
class Settings:
    """What both libraries share (flags of the same names, `--learning-rate` or `--learning_rate`)."""

    epochs: int = field(default=40, metadata={"help": "Training epochs (passes of 10 prompts)."})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Seeds, each run per library."})
    learning_rate: float = field(default=3e-3, metadata={"help": "Learning rate of both agents, in both libraries."})
    num_generations: int = field(default=8, metadata={"help": "Completions per agent per prompt."})
    max_new_tokens: int = field(default=32, metadata={"help": "Completion length."})
    rollout_buffer_size: int = field(default=2, metadata={"help": "Prompts per optimizer step."})
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.6, metadata={"help": "Nucleus sampling probability."})
    top_k: int = field(default=50, metadata={"help": "Top-k sampling."})
    advantage_modes: list[str] = field(
        default_factory=lambda: ["mean", "raw", "rloo"],
        metadata={"help": "CoMLRL advantage_mode values to compare (mean, raw, max, rloo), each a full comparison."},
    )
    advantage_normalization: bool = field(
        default=True, metadata={"help": "CoMLRL's advantage_normalization, in both libraries."}
    )
    ours_optimizer: str = field(
        default="matched",
        metadata={
            "help": "'matched': constant LR, weight decay 0.01, no clipping, like CoMLRL's AdamW.",
            "choices": ["matched", "trl-default"],
        },
    )
    generation_path: str = field(
        default="plain",
        metadata={
            "help": "multiagent_trl's generation: 'plain' (generate), 'continuous_batching' or 'compiled' (see "
            "benchmarks/generation.py, which times the paths side by side).",
            "choices": ["plain", "continuous_batching", "compiled"],
        },
    )
    num_turns: int = field(
        default=1,
        metadata={
            "help": "Turns per episode: 2 adds a second turn whose prompt tells both agents the lengths they wrote "
            "and the target ratio; both libraries then play CoMLRL's tree (G + G*G joint samples per prompt)."
        },
    )
    family: str = field(
        default="magrpo",
        metadata={
            "help": "'magrpo' (MAGRPOTrainer, one comparison per --advantage-modes value), 'ac' (the actor-critic "
            "trainers IAC and MAAC) or 'preference' (MADPO and MARLHF), one comparison per --trainers value.",
            "choices": list(FAMILIES),
        },
    )
    trainers: list[str] = field(
        default_factory=lambda: list(AC_TRAINERS),
        metadata={
            "help": "With --family ac: the actor-critic trainers to compare (iac, maac); with --family preference: "
            "madpo, marlhf (the default there). Each a comparison."
        },
    )
    ours_api: str = field(
        default="comlrl",
        metadata={
            "help": "With --family ac: multiagent_trl's entry point. 'comlrl': IACTrainer/MAACTrainer, the same "
            "script as CoMLRL's with only the import changed; 'native': ActorCriticTrainer/ActorCriticConfig with "
            "the same settings and TRL's own loss (temperature-scaled log-probs, loss_type default).",
            "choices": ["comlrl", "native"],
        },
    )
    critic: str = field(
        default="seed1",
        metadata={
            "help": "With --family ac: the critics' starting model: 'seed1' (the tiny model with other random "
            "weights, tiny_model_path(seed=1)) or 'agent' (the agents' model).",
            "choices": ["seed1", "agent"],
        },
    )
    critic_type: str = field(
        default="v",
        metadata={"help": "With --family ac: 'v' (V(prompt)) or 'q' (Q(prompt, completion)).", "choices": ["v", "q"]},
    )
    critic_learning_rate: float = field(
        default=0.0, metadata={"help": "With --family ac: the critics' learning rate; 0 means --learning-rate."}
    )
    value_loss_coef: float = field(default=0.6, metadata={"help": "With --family ac: weight of the value loss."})
    value_normalization: bool = field(
        default=False, metadata={"help": "With --family ac: ours' critics learn standardized targets."}
    )
    preference_num_candidates: int = field(
        default=8, metadata={"help": "With --family preference: joint candidates sampled per prompt for pairs (K)."}
    )
    preference_pairs_per_sample: int = field(
        default=4, metadata={"help": "With --family preference: pairs kept per prompt (reward_gap selection)."}
    )
    preference_train_batch_size: int = field(
        default=4, metadata={"help": "With --family preference: MADPO's pairs per optimizer step (train_batch_size)."}
    )
    dpo_beta: float = field(default=0.1, metadata={"help": "With --family preference: MADPO's DPO beta."})
    reward_learning_rate: float = field(
        default=1e-3, metadata={"help": "With --family preference: MARLHF's reward-model learning rate."}
    )
    reward_num_train_epochs: int = field(
        default=2, metadata={"help": "With --family preference: MARLHF's reward-model epochs over the pairs."}
    )
    reward_train_batch_size: int = field(
        default=4, metadata={"help": "With --family preference: MARLHF's pairs per reward-model step."}
    )
    eval_samples: int = field(
        default=16,
        metadata={"help": "With --family preference: sampled joint completions scored per held-out prompt."},
    )
    comlrl_python: str = field(default=DEFAULT_COMLRL_PYTHON, metadata={"help": "Interpreter of the CoMLRL venv."})
    jobs: int = field(default=2, metadata={"help": "Training runs at once (CoMLRL's first)."})
    threads: int = field(
        default=0, metadata={"help": "Torch threads per run; 0 means the CPU count divided by --jobs."}
    )
    bin_samples: int = field(default=0, metadata={"help": "Samples per table row; 0 means one epoch."})
    threshold: float = field(
        default=90.0, metadata={"help": "Report the samples needed for a bin mean reward of at least this."}
    )
    json_out: str | None = field(default=None, metadata={"help": "Also write curves and summary to this JSON file."})
    figure: str | None = field(
        default=None,
        metadata={
            "help": "Also draw the joint reward vs samples seen to this PNG (benchmarks/figures.py; `python "
            "benchmarks/figures.py comlrl RESULTS.json PNG` redraws it from --json-out's file)."
        },
    )

    @property
    def samples_per_step(self) -> int:
        return self.rollout_buffer_size * self.num_generations

    @property
    def ac_buffer_samples(self) -> int:
        """The actor-critic trainers' `rollout_buffer_size`, which counts samples per agent, not prompts: every
        sample of `rollout_buffer_size` prompts (all turns: CoMLRL's buffer holds each turn's samples)."""
        return self.rollout_buffer_size * self.num_generations * self.num_turns

    @property
    def variants(self) -> list[str]:
        """What each comparison varies: the advantage modes (MAGRPO) or the trainers (actor-critic)."""
        return self.trainers if self.family in ("ac", "preference") else self.advantage_modes

    def variant_title(self, variant: str) -> str:
        if self.family == "preference":
            pairs = self.preference_pairs_per_sample
            return f"{variant.upper()} (K={self.preference_num_candidates}, pairs per prompt {pairs})"
        if self.family == "ac":
            return f"{variant.upper()} (critic_type={self.critic_type!r}, critic {self.critic})"
        return f"advantage_mode={variant!r} (advantage_normalization={self.advantage_normalization})"


# --------------------------------------------------------------------------------------------------------- workers


def seed_everything(seed: int, threads: int) -> None:
    import random

    import numpy as np
    import torch

    torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# CoMLRL's AdamW: constant learning rate, weight decay 0.01, no gradient clipping (`--ours-optimizer matched`).
MATCHED_OPTIMIZER = dict(lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=0.0)


def ours_trainer(
    settings: Settings, model_path: str, output_dir: str, *, epochs: int, seed: int, advantage_mode: str, reward,
    **extra,
):  # fmt: skip
    """multiagent_trl's `MAGRPOTrainer` on the tutorial's task; `extra`: more `MAGRPOConfig` fields."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors

    config = MAGRPOConfig(
        output_dir=output_dir,
        num_train_epochs=epochs,
        agent_learning_rate=settings.learning_rate,
        logging_steps=1,
        num_agents=2,
        num_generations=settings.num_generations,
        num_turns=settings.num_turns,
        early_termination_threshold=None,
        external_prompt_passthrough=True,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        rollout_buffer_size=settings.rollout_buffer_size,
        advantage_mode=advantage_mode,
        advantage_normalization=settings.advantage_normalization,
        eval_interval=0,
        seed=seed,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        **extra,
    )
    return MAGRPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_path) for _ in range(2)],
        reward_func=reward,
        reward_processor=RewardProcessors.scale(factor=REWARD_SCALE),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS}),
        tokenizer=AutoTokenizer.from_pretrained(model_path),
        external_transition=length_hint if settings.num_turns > 1 else None,
    )


def comlrl_trainer(settings: Settings, model_path: str, *, epochs: int, advantage_mode: str, reward):
    """CoMLRL 1.4.3's `MAGRPOTrainer` on the tutorial's task, with the same settings."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from comlrl.utils.reward_processor import RewardProcessors
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = MAGRPOConfig(
        num_train_epochs=epochs,
        agent_learning_rate=settings.learning_rate,
        logging_steps=1,
        num_agents=2,
        num_generations=settings.num_generations,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        num_turns=settings.num_turns,
        early_termination_threshold=None,
        external_prompt_passthrough=True,
        joint_mode="aligned",
        eval_interval=0,
        rollout_buffer_size=settings.rollout_buffer_size,
        advantage_mode=advantage_mode,
        advantage_normalization=settings.advantage_normalization,
    )
    trainer = MAGRPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_path) for _ in range(2)],
        reward_func=reward,
        reward_processor=RewardProcessors.scale(factor=REWARD_SCALE),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS}),
        tokenizer=AutoTokenizer.from_pretrained(model_path),
        wandb_config=None,  # no wandb.init; the reward wrapper is the log
        external_transition=length_hint if settings.num_turns > 1 else None,
    )
    trainer.verbose = False  # no tqdm bars (CoMLRL reads this from wandb_config, which must stay None)
    return trainer


def train_ours(settings: Settings, model_path: str, seed: int, output_dir: str, advantage_mode: str) -> dict:
    """multiagent_trl: per-step joint rewards from `log_history`, plus every raw reward (cross-check)."""
    from vs_trl import path_settings

    seed_everything(seed, settings.threads)
    optimizer = MATCHED_OPTIMIZER if settings.ours_optimizer == "matched" else {}
    reward = TurnRecordedReward() if settings.num_turns > 1 else RecordedReward()
    trainer = ours_trainer(
        settings, model_path, output_dir, epochs=settings.epochs, seed=seed, advantage_mode=advantage_mode,
        reward=reward, **optimizer, **path_settings(settings.generation_path),
    )  # fmt: skip
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.train()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    step_rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return {
        "step_rewards": step_rewards,
        "raw_rewards": reward.rewards,
        "turns": getattr(reward, "turns", None),
        "train_seconds": wall,
        "train_cpu_seconds": cpu,
    }


def train_comlrl(settings: Settings, model_path: str, seed: int, output_dir: str, advantage_mode: str) -> dict:
    """CoMLRL: every raw reward its reward function returns (one call per aligned joint sample)."""
    seed_everything(seed, settings.threads)
    reward = TurnRecordedReward() if settings.num_turns > 1 else RecordedReward()
    trainer = comlrl_trainer(
        settings, model_path, epochs=settings.epochs, advantage_mode=advantage_mode, reward=reward
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.train()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "step_rewards": None,
        "raw_rewards": reward.rewards,
        "turns": getattr(reward, "turns", None),
        "train_seconds": wall,
        "train_cpu_seconds": cpu,
    }


# ------------------------------------------------------------------------------------------- actor-critic workers


def ac_trainer(
    library: str, settings: Settings, model_path: str, critic_path: str, output_dir: str, *, trainer: str, seed: int,
    reward,
):  # fmt: skip
    """IAC or MAAC, one script for both libraries: CoMLRL 1.4.3's `comlrl.trainers.actor_critic` or multiagent_trl's
    CoMLRL-compatible layer, with the same arguments; only the import differs (and, for ours, where TRL writes its
    output, the seed, and no reporting or progress bars)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    if library == "comlrl":
        os.environ.setdefault("WANDB_MODE", "disabled")
        from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
        from comlrl.utils.reward_processor import RewardProcessors

        bookkeeping = {}
    else:
        from multiagent_trl import IACConfig, IACTrainer, MAACConfig, MAACTrainer, RewardProcessors

        bookkeeping = dict(output_dir=output_dir, seed=seed, report_to="none", disable_tqdm=True)
        bookkeeping["value_normalization"] = settings.value_normalization
    config_class, trainer_class = {"iac": (IACConfig, IACTrainer), "maac": (MAACConfig, MAACTrainer)}[trainer]
    config = config_class(
        num_train_epochs=settings.epochs,
        agent_learning_rate=settings.learning_rate,
        critic_learning_rate=settings.critic_learning_rate or settings.learning_rate,
        value_loss_coef=settings.value_loss_coef,
        advantage_normalization=settings.advantage_normalization,
        rollout_buffer_size=settings.ac_buffer_samples,
        train_batch_size=None,  # one optimizer step per agent, turn and buffer
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        num_agents=2,
        num_generations=settings.num_generations,
        num_turns=settings.num_turns,
        discount=1.0,
        critic_type=settings.critic_type,
        early_termination_threshold=None,  # every episode plays all turns: equal samples
        external_prompt_passthrough=True,
        eval_interval=0,
        logging_steps=1,
        **bookkeeping,
    )
    trainer = trainer_class(
        agent_model=model_path,
        critic_model=critic_path,
        tokenizer=AutoTokenizer.from_pretrained(model_path),
        reward_func=reward,
        reward_processor=RewardProcessors.scale(factor=REWARD_SCALE),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS}),
        external_transition=length_hint if settings.num_turns > 1 else None,
    )
    trainer.verbose = False  # no tqdm bars or epoch prints
    return trainer


class ScaledReward:
    """`reward` times REWARD_SCALE, for the native trainer (which has no `reward_processor`); `reward` records the
    raw values."""

    def __init__(self, reward) -> None:
        self.reward = reward
        self.__name__ = "proper_length_ratio_reward"

    def __call__(self, *args, **kwargs) -> list[float]:
        return [REWARD_SCALE * r for r in self.reward(*args)]


def native_ac_trainer(
    settings: Settings, model_path: str, critic_path: str, output_dir: str, *, trainer: str, seed: int, reward
):
    """multiagent_trl's own `ActorCriticTrainer` with the settings of `ac_trainer` (and CoMLRL's optimizer), but TRL's
    loss as configured by default (`--ours-api native`)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from multiagent_trl import ActorCriticConfig, ActorCriticTrainer

    config = ActorCriticConfig(
        output_dir=output_dir,
        num_train_epochs=settings.epochs,
        learning_rate=settings.learning_rate,
        critic_learning_rate=settings.critic_learning_rate or settings.learning_rate,
        value_loss_coef=settings.value_loss_coef,
        value_normalization=settings.value_normalization,
        advantage_normalization=settings.advantage_normalization,
        critic_type=settings.critic_type,
        joint_critic=trainer == "maac",
        critic_kind="model",
        num_agents=2,
        num_generations=settings.num_generations,
        num_turns=settings.num_turns,
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        per_device_train_batch_size=settings.ac_buffer_samples // settings.num_turns,
        steps_per_generation=1,
        shuffle_dataset=False,
        logging_steps=1,
        seed=seed,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        **MATCHED_OPTIMIZER,
    )
    return ActorCriticTrainer(
        model=model_path,
        reward_funcs=ScaledReward(reward),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS}),
        processing_class=AutoTokenizer.from_pretrained(model_path),
        critic_model=critic_path,
        external_transition=length_hint if settings.num_turns > 1 else None,
    )


def train_ac(library: str, settings: Settings, args: WorkerArguments, output_dir: str) -> dict:
    """One actor-critic run: every raw reward the reward function returns (both libraries call it once per dataset
    item and turn, with each agent's list of completions), the logged per-step rewards (ours), and the times."""
    seed_everything(args.seed, settings.threads)
    reward = TurnRecordedReward() if settings.num_turns > 1 else RecordedReward()
    common = dict(trainer=args.ac_trainer, seed=args.seed, reward=reward)
    if library == "multiagent_trl" and settings.ours_api == "native":
        trainer = native_ac_trainer(settings, args.model_path, args.critic_path, output_dir, **common)
    else:
        trainer = ac_trainer(library, settings, args.model_path, args.critic_path, output_dir, **common)
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.train()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    state = getattr(trainer, "state", None)  # CoMLRL's trainers keep no log: the reward wrapper is the record
    logged = state.log_history if state is not None else []
    step_rewards = [e["reward"] for e in logged if "reward" in e] if state is not None else None
    turn_step_rewards = {
        str(t): [e[f"turn_{t}/reward"] for e in logged if f"turn_{t}/reward" in e]
        for t in range(1, settings.num_turns + 1)
    }
    return {
        "step_rewards": step_rewards,
        "turn_step_rewards": turn_step_rewards if state is not None and settings.num_turns > 1 else None,
        "raw_rewards": reward.rewards,
        "turns": getattr(reward, "turns", None),
        "train_seconds": wall,
        "train_cpu_seconds": cpu,
    }


# -------------------------------------------------------------------------------------------- preference workers


def preference_trainer(
    library: str, settings: Settings, model_path: str, output_dir: str, *, trainer: str, seed: int, agents, reward,
    fresh_pairs_per_pass: bool = False,
):  # fmt: skip
    """MADPO or MARLHF, one script for both libraries: CoMLRL 1.4.3's `comlrl.trainers.preference` or multiagent_trl's
    CoMLRL-compatible classes, with the same arguments; only the import differs (and, for ours, where TRL writes its
    output, the seed, no reporting or progress bars, and for MADPO `num_train_epochs=1` with `num_iterations=epochs`,
    for MARLHF CoMLRL's optimizer: see the module docstring). `fresh_pairs_per_pass`: ours' MADPO instead draws new
    pairs from the current agents on each of the `epochs` passes (`num_train_epochs=epochs`, as many optimizer steps,
    `epochs` times the candidates: benchmarks/learning_curves.py's equal sample budget)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    if library == "comlrl":
        os.environ.setdefault("WANDB_MODE", "disabled")
        from comlrl.trainers.preference import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
        from comlrl.utils.reward_processor import RewardProcessors

        bookkeeping = {}
    else:
        from multiagent_trl import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer, RewardProcessors

        bookkeeping = dict(output_dir=output_dir, seed=seed, report_to="none", disable_tqdm=True)
    common = dict(
        agent_learning_rate=settings.learning_rate,
        num_agents=2,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        rollout_buffer_size=settings.rollout_buffer_size,
        preference_num_candidates=settings.preference_num_candidates,
        preference_pairs_per_sample=settings.preference_pairs_per_sample,
        pair_selection="reward_gap",
        eval_interval=0,  # no evaluation during training: the held-out score after train() is the measure
        logging_steps=1,
        **bookkeeping,
    )
    if trainer == "madpo":
        # CoMLRL samples the pairs once from the initial policies and trains `epochs` passes over them; ours samples
        # each generation batch's pairs from the current policies: one pass over the prompts draws as many candidates,
        # and `num_iterations` trains `epochs` times on each batch's pairs (the same optimizer steps).
        epochs = dict(num_train_epochs=settings.epochs)
        if library != "comlrl" and not fresh_pairs_per_pass:
            epochs = dict(num_train_epochs=1, num_iterations=settings.epochs)
        config = MADPOConfig(
            **epochs, train_batch_size=settings.preference_train_batch_size, dpo_beta=settings.dpo_beta, **common
        )
        trainer_class = MADPOTrainer
    else:
        optimizer = MATCHED_OPTIMIZER if library != "comlrl" and settings.ours_optimizer == "matched" else {}
        config = MARLHFConfig(
            num_train_epochs=settings.epochs,
            rl_algorithm="magrpo",
            num_generations=settings.num_generations,
            advantage_normalization=settings.advantage_normalization,
            reward_model_name=model_path,
            reward_model_device="cpu",  # CoMLRL's default "cuda:0" fails without CUDA
            reward_learning_rate=settings.reward_learning_rate,
            reward_num_train_epochs=settings.reward_num_train_epochs,
            reward_train_batch_size=settings.reward_train_batch_size,
            **common,
            **optimizer,
        )
        trainer_class = MARLHFTrainer
    built = trainer_class(
        agents=agents,
        tokenizer=AutoTokenizer.from_pretrained(model_path),
        reward_func=reward,
        reward_processor=RewardProcessors.scale(factor=REWARD_SCALE),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS}),
        eval_dataset=Dataset.from_dict({"prompt": HELDOUT_PROMPTS}),
    )
    built.verbose = False
    return built


def heldout_rewards(agents, tokenizer, settings: Settings, seed: int) -> list[float]:
    """The task reward of `eval_samples` sampled joint completions per held-out prompt (the training sampling:
    temperature, top_p, top_k, max_new_tokens), the same code and random stream for both libraries' agents."""
    import torch

    generator_seed = 10_000 + seed
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rewards = []
    for index, prompt in enumerate(HELDOUT_PROMPTS):
        encoded = tokenizer(prompt, return_tensors="pt")
        texts = []
        for agent_index, agent in enumerate(agents):
            torch.manual_seed(generator_seed + 100 * index + agent_index)
            agent.eval()
            with torch.inference_mode():
                output = agent.generate(
                    **encoded.to(agent.device),
                    do_sample=True,
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    top_k=settings.top_k,
                    max_new_tokens=settings.max_new_tokens,
                    num_return_sequences=settings.eval_samples,
                    pad_token_id=pad,
                )
            completions = output[:, encoded["input_ids"].shape[1] :]
            texts.append(tokenizer.batch_decode(completions, skip_special_tokens=True))
        rewards += proper_length_ratio_reward(texts[0], texts[1])
    return rewards


def train_preference(library: str, settings: Settings, args: WorkerArguments, output_dir: str) -> dict:
    """One MADPO/MARLHF run: held-out task reward of the initial and of the trained agents, every task reward computed
    in training (MADPO: every candidate; MARLHF: the pair stage's, the online stage scores with the reward model),
    optimizer steps of agent 0, and the times of `train()`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    agents = [AutoModelForCausalLM.from_pretrained(args.model_path) for _ in range(2)]
    seed_everything(args.seed, settings.threads)
    before = heldout_rewards(agents, tokenizer, settings, args.seed)
    seed_everything(args.seed, settings.threads)
    reward = RecordedReward()
    trainer = preference_trainer(
        library, settings, args.model_path, output_dir, trainer=args.ac_trainer, seed=args.seed, agents=agents,
        reward=reward,
    )  # fmt: skip
    steps = [0]
    if library == "comlrl":
        trainer.optimizers[0].register_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    snapshot = [p.detach().clone() for p in agents[0].parameters()]
    stopped = None
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        trainer.train()
    except ValueError as error:  # ours: a generation batch without any pair raises (CoMLRL trains on nothing)
        if library == "comlrl" or "No preference pair" not in str(error):
            raise
        stopped = str(error).split(":")[0] + f" at step {trainer.state.global_step}"
        print(f"multiagent_trl stopped: {stopped}", flush=True)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    trained = list(trainer.agents) if library == "comlrl" else agents
    if library != "comlrl":
        steps[0] = trainer.state.global_step
        moved = any(not (p.detach() == q).all() for p, q in zip(agents[0].parameters(), snapshot))
        if not moved:
            raise RuntimeError("multiagent_trl did not train the agent objects it was given")
    after = heldout_rewards(trained, tokenizer, settings, args.seed)
    return {
        "heldout_before": before,
        "heldout_after": after,
        "raw_rewards": reward.rewards,
        "optimizer_steps": steps[0],
        "stopped": stopped,
        "train_seconds": wall,
        "train_cpu_seconds": cpu,
    }


def run_worker(args: WorkerArguments, settings: Settings) -> None:
    with tempfile.TemporaryDirectory() as output_dir:
        if settings.family == "ac":
            result = train_ac(args.worker, settings, args, output_dir)
        elif settings.family == "preference":
            result = train_preference(args.worker, settings, args, output_dir)
        else:
            train = train_ours if args.worker == "multiagent_trl" else train_comlrl
            result = train(settings, args.model_path, args.seed, output_dir, args.advantage_mode)
    Path(args.out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------------------- driver


def launch(
    library: str, python: str, settings: Settings, model_path: str, seed: int, workdir: Path, mode: str,
    critic_path: str | None = None,
) -> dict:  # fmt: skip
    """Run one library's training in a subprocess under its own interpreter; return its result with wall time.
    `mode`: the advantage mode (MAGRPO) or the trainer (actor-critic, with the critics' `critic_path`)."""
    out = workdir / f"{library}-{mode}-seed{seed}.json"
    log = workdir / f"{library}-{mode}-seed{seed}.log"
    command = [
        python,
        os.path.abspath(__file__),
        "--worker",
        library,
        "--model-path",
        model_path,
        "--seed",
        str(seed),
        "--out",
        str(out),
        *(["--ac-trainer", mode, "--critic-path", str(critic_path)] if settings.family == "ac" else []),
        *(["--ac-trainer", mode] if settings.family == "preference" else []),
        *(["--advantage-mode", mode] if settings.family == "magrpo" else []),
        *settings_to_flags(settings),
    ]
    threads = str(settings.threads)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }
    start = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.perf_counter() - start
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise RuntimeError(f"{library} (seed {seed}) failed with exit code {code}; log tail:\n{tail}")
    result = json.loads(out.read_text())
    result["process_seconds"] = wall
    what = mode if settings.family != "magrpo" else f"advantage_mode={mode}"
    print(f"  done: {library} {what} seed {seed}, {wall:.0f} s", flush=True)
    return result


def per_sample_rewards(library: str, result: dict, settings: Settings) -> list[float]:
    """Scaled joint reward of every sample in generation order (ours: each step's logged mean, per sample)."""
    raw = [REWARD_SCALE * r for r in result["raw_rewards"]]
    if library == "comlrl" or settings.num_turns > 1:  # multi-turn: ours logs returns; the wrapper has every reward
        return raw
    if settings.family == "ac" and not result["step_rewards"]:
        return raw
    step = settings.samples_per_step
    logged = result["step_rewards"]
    if len(logged) * step != len(raw):
        raise RuntimeError(f"multiagent_trl logged {len(logged)} steps but scored {len(raw)} samples")
    for k, value in enumerate(logged):  # the log and the wrapper must agree
        hooked = statistics.fmean(raw[k * step : (k + 1) * step])
        if abs(hooked - value) > 1e-3 * max(1.0, abs(value)):
            raise RuntimeError(f"multiagent_trl step {k}: logged reward {value} != recorded {hooked}")
    return [value for value in logged for _ in range(step)]


def ac_turns_from_log(result: dict, settings: Settings) -> list[int]:
    """multiagent_trl's multi-turn actor-critic: the turn of each recorded reward, from the order the trainer scores
    them (per optimizer step: every episode's turn 1, then every episode's turn 2, ...), checked against the per-turn
    means it logs (the same labels for either library's prompts: the order alone tells the turn)."""
    per_turn = settings.rollout_buffer_size * settings.num_generations
    step = per_turn * settings.num_turns
    raw, logged = result["raw_rewards"], result["turn_step_rewards"]
    steps = len(raw) // step
    if steps * step != len(raw) or any(len(logged[str(t)]) != steps for t in range(1, settings.num_turns + 1)):
        raise RuntimeError(f"multiagent_trl scored {len(raw)} rewards but logged {len(logged['1'])} steps")
    turns = []
    for k in range(steps):
        for t in range(1, settings.num_turns + 1):
            start = k * step + (t - 1) * per_turn
            hooked, value = REWARD_SCALE * statistics.fmean(raw[start : start + per_turn]), logged[str(t)][k]
            if abs(hooked - value) > 1e-3 * max(1.0, abs(value)):
                raise RuntimeError(f"multiagent_trl step {k} turn {t}: logged reward {value} != recorded {hooked}")
            turns += [t] * per_turn
    return turns


def binned(rewards: list[float], size: int) -> list[float]:
    return [statistics.fmean(rewards[start : start + size]) for start in range(0, len(rewards), size)]


def samples_to_reach(curve: list[float], size: int, threshold: float) -> int | None:
    """Samples seen at the end of the first bin whose mean reward reaches `threshold`."""
    return next(((k + 1) * size for k, value in enumerate(curve) if value >= threshold), None)


def summarize(curves: list[list[float]], size: int, settings: Settings) -> dict:
    """Per-seed AUC (mean reward over all samples), final-bin reward and samples to threshold, then seed means."""
    aucs = [statistics.fmean(curve) for curve in curves]
    finals = [curve[-1] for curve in curves]
    reach = [samples_to_reach(curve, size, settings.threshold) for curve in curves]
    return {"auc": aucs, "final": finals, "reach": reach}


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:6.1f}"
    return f"{statistics.fmean(values):6.1f} ± {statistics.stdev(values):4.1f}"


def print_report(
    curves: dict[str, list[list[float]]], results: dict[str, list[dict]], settings: Settings, mode: str
) -> dict:
    size = settings.bin_samples
    seeds = ", ".join(map(str, settings.seeds))
    print(
        f"\n=== {settings.variant_title(mode)} ===\n"
        f"Joint reward (x{REWARD_SCALE:g}) vs samples seen per agent; bins of {size} samples, mean ± std over "
        f"seeds [{seeds}]"
    )
    print(f"{'samples':>8} | {'multiagent_trl':>15} | {'comlrl':>15} | {'ours/theirs':>11}")
    print("-" * 60)
    bins = min(len(curve) for runs in curves.values() for curve in runs)
    for k in range(bins):
        ours = [curve[k] for curve in curves["multiagent_trl"]]
        theirs = [curve[k] for curve in curves["comlrl"]]
        ratio = statistics.fmean(ours) / statistics.fmean(theirs) if statistics.fmean(theirs) else float("nan")
        print(f"{(k + 1) * size:>8} | {mean_std(ours):>15} | {mean_std(theirs):>15} | {ratio:>11.2f}")

    summary = {library: summarize(curves[library], size, settings) for library in LIBRARIES}
    print("\nSummary: mean over seeds [per seed]; ours/theirs is the ratio of the means")
    print(f"{'':34} | {'multiagent_trl':>26} | {'comlrl':>26} | {'ours/theirs':>11}")
    print("-" * 108)
    rows = [
        ("AUC (mean reward over all samples)", summary["multiagent_trl"]["auc"], summary["comlrl"]["auc"]),
        ("final reward (last bin)", summary["multiagent_trl"]["final"], summary["comlrl"]["final"]),
        (
            f"samples to reach {settings.threshold:g} (lower=better)",
            summary["multiagent_trl"]["reach"],
            summary["comlrl"]["reach"],
        ),
    ]
    times = (
        ("train_cpu_seconds", "train CPU time (s)"),
        ("train_seconds", "train wall time (s)"),
        ("process_seconds", "process wall time (s)"),
    )
    for key, label in times:
        rows.append((label, [r[key] for r in results["multiagent_trl"]], [r[key] for r in results["comlrl"]]))
    for label, ours, theirs in rows:
        print(summary_row(label, ours, theirs))
    total = {library: sum(r["process_seconds"] for r in results[library]) for library in LIBRARIES}
    print(f"\nTotal wall time: multiagent_trl {total['multiagent_trl']:.0f} s, comlrl {total['comlrl']:.0f} s")
    return {
        "curves": curves,
        "summary": summary,
        "wall": {
            lib: [{k: r[k] for k in ("train_cpu_seconds", "train_seconds", "process_seconds")} for r in results[lib]]
            for lib in LIBRARIES
        },
    }


def print_turn_report(results: dict[str, list[dict]], settings: Settings, mode: str) -> dict:
    """Multi-turn: each turn's mean joint reward per epoch (both libraries, the same samples: every node of the tree
    is expanded), the reward calls and completions per prompt, and the times."""
    prompts, g = len(TRAIN_PROMPTS), settings.num_generations
    curves = {lib: {t: [] for t in range(1, settings.num_turns + 1)} for lib in LIBRARIES}
    for lib in LIBRARIES:
        for result in results[lib]:
            for t in curves[lib]:
                rewards = [REWARD_SCALE * r for r, turn in zip(result["raw_rewards"], result["turns"]) if turn == t]
                curves[lib][t].append(binned(rewards, prompts * g**t))
    title = f"{settings.num_turns} turns, {settings.variant_title(mode)}: joint reward (x{REWARD_SCALE:g}) per epoch"
    print(f"\n=== {title}")
    columns = [f"{lib[:6]} t{t}" for t in curves["comlrl"] for lib in LIBRARIES]
    print(f"{'epoch':>5} | " + " | ".join(f"{c:>15}" for c in columns))
    epochs = min(len(c) for lib in LIBRARIES for t in curves[lib] for c in curves[lib][t])
    for k in range(epochs):
        cells = [mean_std([c[k] for c in curves[lib][t]]) for t in curves["comlrl"] for lib in LIBRARIES]
        print(f"{k + 1:>5} | " + " | ".join(f"{c:>15}" for c in cells))
    print(f"\n{'':34} | {'multiagent_trl':>26} | {'comlrl':>26} | {'ours/theirs':>11}")
    rows = []
    for t in curves["comlrl"]:
        rows.append(
            (
                f"turn {t}: mean reward, all epochs",
                *[[statistics.fmean(c) for c in curves[lib][t]] for lib in LIBRARIES],
            )
        )
        rows.append((f"turn {t}: final epoch", *[[c[-1] for c in curves[lib][t]] for lib in LIBRARIES]))
    per_prompt = {
        lib: [len(r["raw_rewards"]) / (prompts * settings.epochs) for r in results[lib]] for lib in LIBRARIES
    }
    rows.append(("reward calls per prompt", per_prompt["multiagent_trl"], per_prompt["comlrl"]))
    for key, label in (("train_seconds", "train wall time (s)"), ("train_cpu_seconds", "train CPU time (s)")):
        rows.append((label, *[[r[key] for r in results[lib]] for lib in LIBRARIES]))
    for label, ours, theirs in rows:
        print(summary_row(label, ours, theirs))
    return {"turn_curves": curves, "reward_calls_per_prompt": per_prompt}


def print_preference_report(results: dict[str, list[dict]], settings: Settings, mode: str) -> dict:
    """MADPO/MARLHF: the task reward of the trained agents on the held-out prompts (and of the initial agents, the
    same for both libraries), the task rewards scored in training, agent 0's optimizer steps and the times."""
    seeds = ", ".join(map(str, settings.seeds))
    print(
        f"\n=== {settings.variant_title(mode)}: joint task reward (x{REWARD_SCALE:g}) on {len(HELDOUT_PROMPTS)} "
        f"held-out prompts x {settings.eval_samples} sampled joint completions; mean over seeds [{seeds}]"
    )
    print(f"{'':34} | {'multiagent_trl':>26} | {'comlrl':>26} | {'ours/theirs':>11}")
    print("-" * 108)

    def per_run(key, scale=1.0):
        return [[scale * statistics.fmean(r[key]) for r in results[lib]] for lib in LIBRARIES]

    rows = [
        ("held-out reward, initial agents", *per_run("heldout_before", REWARD_SCALE)),
        ("held-out reward, trained agents", *per_run("heldout_after", REWARD_SCALE)),
        ("task reward of training samples", *per_run("raw_rewards", REWARD_SCALE)),
        ("task reward calls in train()", *[[len(r["raw_rewards"]) for r in results[lib]] for lib in LIBRARIES]),
        ("optimizer steps (agent 0)", *[[r["optimizer_steps"] for r in results[lib]] for lib in LIBRARIES]),
        ("train CPU time (s)", *[[r["train_cpu_seconds"] for r in results[lib]] for lib in LIBRARIES]),
        ("train wall time (s)", *[[r["train_seconds"] for r in results[lib]] for lib in LIBRARIES]),
        ("process wall time (s)", *[[r["process_seconds"] for r in results[lib]] for lib in LIBRARIES]),
    ]
    for label, ours, theirs in rows:
        print(summary_row(label, ours, theirs))
    for lib in LIBRARIES:
        for seed, result in zip(settings.seeds, results[lib]):
            if result.get("stopped"):
                print(f"{lib} seed {seed}: train() raised '{result['stopped']}'; scored the agents as they were")
    summary = {label: {"multiagent_trl": ours, "comlrl": theirs} for label, ours, theirs in rows}
    gain = {lib: [statistics.fmean(r["heldout_after"]) - statistics.fmean(r["heldout_before"]) for r in results[lib]]
            for lib in LIBRARIES}  # fmt: skip
    print(
        f"Held-out gain over the initial agents (x{REWARD_SCALE:g}): "
        + ", ".join(f"{lib} {REWARD_SCALE * statistics.fmean(gain[lib]):+.1f}" for lib in LIBRARIES)
    )
    return {"summary": summary, "runs": results}


def format_seeds(values: list[float | None]) -> str:
    """`mean [v1 v2 ...]`; the mean is `-` when a value is missing (a run that never reached the threshold)."""

    def number(value: float | None) -> str:
        return "never" if value is None else f"{value:.0f}" if value >= 1000 else f"{value:.1f}"

    mean = "-" if None in values else number(statistics.fmean(values))
    return f"{mean} [{' '.join(number(v) for v in values)}]"


def summary_row(label: str, ours: list[float | None], theirs: list[float | None]) -> str:
    ratio = "-" if None in ours or None in theirs else f"{statistics.fmean(ours) / statistics.fmean(theirs):.2f}"
    return f"{label:34} | {format_seeds(ours):>26} | {format_seeds(theirs):>26} | {ratio:>11}"


def run_driver(settings: Settings) -> None:
    from multiagent_trl.testing import tiny_model_path  # our venv builds (and caches) the shared model folder

    if not Path(settings.comlrl_python).exists():
        sys.exit(f"CoMLRL interpreter {settings.comlrl_python} not found; see the install lines in the docstring.")
    model_path = tiny_model_path()
    critic_path = None
    if settings.family == "ac":
        if settings.num_turns > 1 and settings.num_generations != 1:
            sys.exit("Multi-turn actor-critic continues one completion per prompt: add --num-generations 1.")
        critic_path = tiny_model_path(seed=1) if settings.critic == "seed1" else model_path
    expected = {"ac": AC_TRAINERS, "preference": PREFERENCE_TRAINERS}.get(settings.family)
    if settings.family == "preference" and settings.trainers == list(AC_TRAINERS):
        settings.trainers = list(PREFERENCE_TRAINERS)  # the flag's default names the actor-critic trainers
    if expected and not set(settings.trainers) <= set(expected):
        sys.exit(f"--family {settings.family} compares {', '.join(expected)}; got --trainers {settings.trainers}.")
    if settings.family == "preference" and settings.num_turns != 1:
        sys.exit("MADPO and MARLHF are single-turn (CoMLRL 1.4.3): leave --num-turns 1.")
    if settings.family == "preference" and settings.figure:
        sys.exit("--figure draws reward curves; --family preference reports held-out rewards only (use --json-out).")
    if settings.bin_samples <= 0:
        settings.bin_samples = len(TRAIN_PROMPTS) * settings.num_generations
    if settings.threads <= 0:
        settings.threads = max(1, (os.cpu_count() or 1) // settings.jobs)
    pythons = {"multiagent_trl": sys.executable, "comlrl": settings.comlrl_python}
    print(f"Model: {model_path}\nCritic: {critic_path}\nSettings: {json.dumps(asdict(settings))}", flush=True)
    # CoMLRL's runs are the slower ones: start them first so that the runs in flight finish close together.
    modes = settings.variants
    tasks = [(library, mode, seed) for mode in modes for library in reversed(LIBRARIES) for seed in settings.seeds]
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(max_workers=settings.jobs) as pool:
        futures = {
            (lib, mode, seed): pool.submit(
                launch, lib, pythons[lib], settings, model_path, seed, Path(workdir), mode, critic_path
            )
            for lib, mode, seed in tasks
        }
        reports = {}
        for mode in modes:
            results = {lib: [futures[lib, mode, seed].result() for seed in settings.seeds] for lib in LIBRARIES}
            if settings.family == "preference":
                reports[mode] = print_preference_report(results, settings, mode)
                continue
            if settings.num_turns > 1:
                if settings.family == "ac":
                    for result in results["multiagent_trl"]:
                        result["turns"] = ac_turns_from_log(result, settings)
                reports[mode] = print_turn_report(results, settings, mode)
                continue
            curves: dict[str, list[list[float]]] = {library: [] for library in LIBRARIES}
            for library in LIBRARIES:
                for seed, result in zip(settings.seeds, results[library]):
                    rewards = per_sample_rewards(library, result, settings)
                    curves[library].append(binned(rewards, settings.bin_samples))
                    print(
                        f"  {library:15} {mode:5} seed {seed}: {len(rewards)} samples per agent, mean reward "
                        f"{statistics.fmean(rewards):.1f}, {result['process_seconds']:.0f} s",
                        flush=True,
                    )
            reports[mode] = print_report(curves, results, settings, mode)
    saved = json.dumps({"settings": asdict(settings), "num_prompts": len(TRAIN_PROMPTS), "modes": reports}, indent=1)
    if settings.json_out:
        Path(settings.json_out).write_text(saved)
        print(f"Results written to {settings.json_out}")
    if settings.figure:
        from figures import comlrl_figure  # benchmarks/figures.py, beside this script

        # Drawn from the JSON text, so that the figure is the one `figures.py` redraws from the saved file.
        print(f"Figure written to {comlrl_figure(json.loads(saved), settings.figure)}")


# ----------------------------------------------------------------------------------------------------------- flags


def settings_to_flags(settings: Settings) -> list[str]:
    """The shared flags, to hand the same settings to a worker."""
    flags = []
    for key, value in asdict(settings).items():
        if key in ("seeds", "json_out", "figure", "comlrl_python", "jobs", "advantage_modes", "trainers"):
            continue
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


@dataclass
class WorkerArguments:
    """Internal: run one library's training, in that library's interpreter (hidden from `--help`)."""

    worker: str | None = field(default=None, metadata={"choices": list(LIBRARIES), "help": argparse.SUPPRESS})
    model_path: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})
    seed: int = field(default=0, metadata={"help": argparse.SUPPRESS})
    out: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})
    advantage_mode: str = field(default="mean", metadata={"help": argparse.SUPPRESS})
    ac_trainer: str = field(default="iac", metadata={"help": argparse.SUPPRESS})
    critic_path: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})


def parse_args(argv: list[str] | None = None) -> tuple[WorkerArguments, Settings]:
    """The flags, parsed into the worker's arguments and the shared settings."""
    # transformers' parser rather than TRL's: the workers also parse under CoMLRL's interpreter, which has no TRL.
    from transformers import HfArgumentParser

    parser = HfArgumentParser((Settings, WorkerArguments), description=__doc__.split("\n")[0])
    settings, args = parser.parse_args_into_dataclasses(args=argv)
    return args, settings


def main() -> None:
    args, settings = parse_args()
    if args.worker:
        run_worker(args, settings)
    else:
        run_driver(settings)


if __name__ == "__main__":
    main()
