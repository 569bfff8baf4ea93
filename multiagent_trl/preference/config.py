"""`MultiAgentDPOConfig`: `MultiAgentGRPOConfig` plus the preference fields, for `MultiAgentDPOTrainer` (MADPO)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import MultiAgentGRPOConfig
from .losses import JOINT_DPO_LOSS_TYPES
from .pairs import PAIR_SELECTIONS


@dataclass
class MultiAgentDPOConfig(MultiAgentGRPOConfig):
    r"""
    Configuration for `MultiAgentDPOTrainer`: every `MultiAgentGRPOConfig` field, plus the preference fields.

    Each generation batch, every agent samples K = `num_generations` completions per prompt; the joint reward scores
    the K aligned joint candidates (`reward_funcs`, `reward_weights`, the trainer's `reward_processor`), and
    `(winner, loser)` pairs of joint candidates are selected per prompt. Each agent is then trained with the joint
    DPO loss `-logsigmoid(dpo_beta * sum_j delta_j)` through its own log-ratio `delta_i` only (CoMLRL's MADPO).

    Fields that GRPO also has keep GRPO's meaning: `per_device_train_batch_size` and `steps_per_generation` count
    sampled completions (the generation batch is `per_device_train_batch_size * steps_per_generation` completions
    per agent, `/ num_generations` prompts), `num_iterations` trains on one generation batch's pairs that many times,
    `temperature`, `top_p`, `top_k` are the sampling settings. The pairs of a generation batch are shuffled and split
    evenly into its `steps_per_generation` optimizer steps (or `pair_steps_per_generation`).

    Parameters:
        dpo_beta (`float`, *optional*, defaults to `0.1`):
            DPO's inverse temperature beta (> 0). (GRPO's `beta`, a KL coefficient, must stay 0 here.)
        dpo_loss_type (`str`, *optional*, defaults to `"sigmoid"`):
            The loss on the team's joint margin `m = dpo_beta * sum_j delta_j`: `"sigmoid"` (`-logsigmoid(m)`, DPO's
            and CoMLRL's) or `"hinge"` (`relu(1 - m)`, TRL's DPO `loss_type="hinge"`). (GRPO's `loss_type` does not
            apply here.)
        pair_selection (`str`, *optional*, defaults to `"reward_gap"`):
            Which pairs of a prompt's candidates to train on. Allowed values (case-insensitive): `"reward_gap"`
            (largest reward gap first), `"random"` (a random order), `"all"` (every strictly ordered pair; needs
            `preference_pairs_per_sample=None`). See `multiagent_trl.preference.pairs`.
        preference_pairs_per_sample (`int` or `None`, *optional*, defaults to `16`):
            At most this many pairs per prompt (`None`: every strictly ordered pair, at most `K * (K - 1) / 2`).
            A prompt with fewer pairs (ties make none) leaves the rest of its slots empty: the batch holds a fixed
            number of pair rows, the empty ones with weight 0.
        reference_free (`bool`, *optional*, defaults to `True`):
            `True`: the log-ratio is `logp(winner) - logp(loser)` (CoMLRL's MADPO, no reference model). `False`:
            TRL's DPO log-ratio against the agent's starting policy, `(logp_w - ref_logp_w) - (logp_l - ref_logp_l)`;
            the reference is a frozen copy of each agent's starting model, or, for LoRA agents, the base with the
            adapters disabled. Its log-probabilities are computed once per generation batch.
        pair_steps_per_generation (`int` or `None`, *optional*, defaults to `None`):
            The optimizer steps a generation batch's pairs are split into, when they should differ from
            `steps_per_generation` (`None`: the same). Every pair count makes many more pairs than completions, and
            a step count that does not divide the completions (`per_device_train_batch_size * steps_per_generation`)
            is set here: the generation batch keeps its completions and its pair rows (rounded up to whole steps,
            empty slots weighted 0) are split into this many steps, as many per epoch and generation batch.
        drop_last_token (`bool`, *optional*, defaults to `False`):
            Score completions as CoMLRL 1.4.3's decentralized MADPO does: cut at the first padding token, and leave
            the last remaining token unscored (the end token, or the last word of a completion cut at the length
            limit). `False` scores every token of the completion as TRL generated it (the end token included).

    Log-probabilities are sums over the completion's tokens of log-softmax of the raw logits (temperature 1,
    whatever the sampling temperature), as in DPO and CoMLRL.

    > [!NOTE]
    > Single turn, aligned joint samples only (`num_turns=1`, `joint_mode="aligned"`); `beta`, `loss_type`,
    > `epsilon`, `scale_rewards` and `advantage_baseline` do not apply.
    """

    dpo_beta: float = field(default=0.1, metadata={"help": "DPO's inverse temperature beta (> 0)."})
    dpo_loss_type: str = field(
        default="sigmoid",
        metadata={
            "help": "The loss on the joint margin: 'sigmoid' (DPO's) or 'hinge'.",
            "choices": list(JOINT_DPO_LOSS_TYPES),
        },
    )
    pair_selection: str = field(
        default="reward_gap",
        metadata={
            "help": "Which pairs of a prompt's joint candidates to train on: 'reward_gap', 'random' or 'all'.",
            "choices": list(PAIR_SELECTIONS),
        },
    )
    preference_pairs_per_sample: int | None = field(
        default=16, metadata={"help": "At most this many pairs per prompt; None: every strictly ordered pair."}
    )
    reference_free: bool = field(
        default=True,
        metadata={"help": "True: log-ratios without a reference (CoMLRL's MADPO); False: against the start policy."},
    )
    pair_steps_per_generation: int | None = field(
        default=None,
        metadata={"help": "Optimizer steps a generation batch's pairs are split into; None: steps_per_generation."},
    )
    drop_last_token: bool = field(
        default=False,
        metadata={"help": "Score completions as CoMLRL's MADPO: cut at the first pad, last token unscored."},
    )

    def __post_init__(self):
        self.pair_selection = str(self.pair_selection).strip().lower()
        if self.pair_selection not in PAIR_SELECTIONS:
            raise ValueError(f"`pair_selection` must be one of {PAIR_SELECTIONS}, got {self.pair_selection!r}.")
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError(
                "`pair_selection='all'` trains on every ordered pair, so it takes no limit: set "
                f"`preference_pairs_per_sample=None` (got {self.preference_pairs_per_sample}), or choose "
                "`pair_selection='reward_gap'` or `'random'` to keep a number of pairs per prompt."
            )
        if self.preference_pairs_per_sample is not None and self.preference_pairs_per_sample < 1:
            raise ValueError(
                f"`preference_pairs_per_sample` must be at least 1, or None for no limit; got "
                f"{self.preference_pairs_per_sample}."
            )
        if self.pair_steps_per_generation is not None and self.pair_steps_per_generation < 1:
            raise ValueError(
                f"`pair_steps_per_generation` must be at least 1, or None for `steps_per_generation`; got "
                f"{self.pair_steps_per_generation}."
            )
        if self.dpo_loss_type not in JOINT_DPO_LOSS_TYPES:
            raise ValueError(
                f"`dpo_loss_type` must be one of {JOINT_DPO_LOSS_TYPES} (TRL's DPO losses of the margin alone), got "
                f"{self.dpo_loss_type!r}."
            )
        if not self.dpo_beta > 0:
            raise ValueError(f"`dpo_beta` must be > 0 (DPO's inverse temperature), got {self.dpo_beta}.")
        if self.num_generations is not None and self.num_generations < 2:
            raise ValueError(
                f"`num_generations` (K, the candidates per prompt) must be at least 2 to make a pair, got "
                f"{self.num_generations}."
            )
        if self.num_turns != 1:
            raise ValueError(
                f"MADPO trains single-turn episodes: set `num_turns=1` (got {self.num_turns}); for multi-turn "
                "episodes use MultiAgentGRPOTrainer."
            )
        if self.joint_mode != "aligned":
            raise ValueError(
                "A preference pair compares two joint samples (every agent's k-th completion): set "
                f"`joint_mode='aligned'` (got {self.joint_mode!r})."
            )
        super().__post_init__()
        self.check_pair_steps()
        betas = self.beta if isinstance(self.beta, list) else [self.beta]
        if any(b != 0.0 for b in betas):
            raise ValueError(
                f"`beta={self.beta}` is GRPO's KL coefficient, which the DPO loss does not use: leave it at 0. DPO's "
                "inverse temperature is `dpo_beta`; a reference model comes with `reference_free=False`."
            )

    def check_pair_steps(self) -> None:
        """Raise when a generation batch's pair rows (each process's prompts x `pairs_per_prompt`) are fewer than its
        optimizer steps (`pair_steps`): a step without a pair would still move the weights (AdamW's momentum and
        weight decay) and use up the schedule."""
        prompts = self.per_device_train_batch_size * self.steps_per_generation // self.num_generations
        if prompts * self.pairs_per_prompt < self.pair_steps:
            steps = "pair_steps_per_generation" if self.pair_steps_per_generation else "steps_per_generation"
            raise ValueError(
                f"A generation batch holds {prompts} prompt(s) per process (`per_device_train_batch_size * "
                f"steps_per_generation / num_generations`) of at most {self.pairs_per_prompt} pair(s) each, fewer "
                f"pairs than its {self.pair_steps} optimizer steps (`{steps}`): some steps would train on no pair. "
                f"Raise `per_device_train_batch_size` or `preference_pairs_per_sample`, or lower `{steps}`."
            )

    @property
    def pair_steps(self) -> int:
        """The optimizer steps of one generation batch: `pair_steps_per_generation`, else `steps_per_generation`."""
        return self.pair_steps_per_generation or self.steps_per_generation

    @property
    def pairs_per_prompt(self) -> int:
        """The pair rows each prompt gets in a batch: `preference_pairs_per_sample`, or every strictly ordered pair
        (`K * (K - 1) / 2`) when it is `None`, whichever is smaller."""
        most = self.num_generations * (self.num_generations - 1) // 2
        limit = self.preference_pairs_per_sample
        return most if limit is None else min(limit, most)
