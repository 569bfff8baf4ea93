"""What an actor-critic step computes, as pure functions on tensors: log-probabilities, values, TD targets,
advantages and the two losses, as CoMLRL 1.4.3's IAC and MAAC compute them (`tests/test_actor_critic_math.py`
checks each against CoMLRL's own code).

Shapes: B rows (one completion each), T positions (prompt then completion) or turns, V vocabulary.

One row of CoMLRL's actor-critic:

1. The actor's sequence log-probability: the sum over the completion's tokens of log softmax of the raw logits
   (temperature 1, whatever the sampling temperature), `sequence_logprobs`.
2. The critic's value at a position of its per-position values (`values_at`): the last prompt token for V(prompt),
   the last completion token for Q(prompt, completion) (`value_positions`). MAAC's one critic reads a text built
   from every agent's prompt (and completion, for Q): `joint_critic_text`.
3. The target y: the reward in a single turn; `r_t + discount * V_old(t + 1)` in a multi-turn episode, where the
   last turn played is terminal (`td_targets`). V_old is the value computed when the rollout was generated.
4. The advantage `y - V_old`, normalized over the update's samples (`advantages`).
5. The actor's loss `mean(-logp * A)` (a REINFORCE step with a learned baseline: no ratio, no clipping, one pass,
   `policy_gradient_loss`), and the critic's `coef * mean((y - v)^2)`, clipped around V_old for IAC's value head on
   the agent itself (`value_loss`).

Beyond CoMLRL: the same advantages can drive TRL's GRPO loss instead of step 5's actor loss (ratio, clipping,
several iterations per generation, every `loss_type`): TRL's `GRPOTrainer._compute_loss` reads one advantage per
row from `inputs["advantages"]` (shape `(B,)`, or `(B, T)` per token), in the rows' order, and never recomputes
it. A trainer that overrides `_generate_and_score_completions` and writes the critic's advantages there (in place of
GRPO's group-normalized rewards) trains its actors on a learned baseline with everything else of TRL's loss
unchanged (`with_advantages`). With `num_iterations=1`, `beta=0` and the loss's log-probabilities at temperature 1,
TRL's `loss_type="luspo"` (sum over tokens, mean over rows) has CoMLRL's actor gradient exactly: at ratio 1 the
per-token term `-A * exp(logp - logp.detach())` has the gradient `-A * grad(logp)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from trl.trainer.utils import selective_log_softmax

# ---- 1. the actor's sequence log-probability


def response_lengths(completion_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """Each completion's length as CoMLRL reads it: the index of its first padding token (all of it if none).

    When the padding token is also the end-of-sequence token, the end token is therefore not part of the completion
    (not scored, and Q reads the token before it); with distinct tokens it is.

    >>> response_lengths(torch.tensor([[5, 6, 0, 0], [5, 6, 7, 8], [0, 0, 0, 0]]), pad_token_id=0).tolist()
    [2, 4, 0]
    """
    is_pad = completion_ids == pad_token_id  # (B, C)
    width = torch.full_like(completion_ids[:, 0], completion_ids.shape[1])
    return torch.where(is_pad.any(dim=1), is_pad.int().argmax(dim=1), width)  # (B,)


def response_mask(prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, total_length: int) -> torch.Tensor:
    """`(B, T)` True at each row's completion tokens: positions `P <= j < P + R`.

    Args:
        prompt_lengths: `(B,)` P, where each row's completion starts (with left-padded prompts, the padded width).
        response_lengths: `(B,)` R, the completion's scored length (`response_lengths`).
        total_length: T, the rows' length.

    AND a completion loss mask into the result to leave tokens out (CoMLRL reads one from a sample's
    `metadata["completion_loss_mask"]`).

    >>> response_mask(torch.tensor([2, 1]), torch.tensor([2, 0]), 5).int().tolist()
    [[0, 0, 1, 1, 0], [0, 0, 0, 0, 0]]
    """
    positions = torch.arange(total_length, device=prompt_lengths.device)  # (T,)
    start, end = prompt_lengths[:, None], (prompt_lengths + response_lengths)[:, None]  # (B, 1)
    return (positions >= start) & (positions < end)  # (B, T)


def sequence_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The log-probability of each row's masked tokens, summed: `sum_j mask[j] * log p(input_ids[j] | < j)`.

    Args:
        logits: `(B, T, V)` the actor's logits on `input_ids` (position j predicts token j + 1), at temperature 1:
            CoMLRL never divides them by the sampling temperature (TRL's GRPO does).
        input_ids: `(B, T)` prompt then completion.
        mask: `(B, T)` the tokens to score (`response_mask`); position 0 cannot be scored (nothing predicts it).

    Returns:
        `(B,)` in the logits' dtype; a row with nothing to score gets 0.

    >>> logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens
    >>> sequence_logprobs(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[False, True, True]]))  # 2 log(1/4)
    tensor([-2.7726])
    """
    token_logps = selective_log_softmax(logits[:, :-1], input_ids[:, 1:])  # (B, T-1): token j+1 from position j
    return token_logps.masked_fill(~mask[:, 1:].bool(), 0.0).sum(dim=-1)  # (B,)


# ---- 2. values at a position


def value_positions(
    critic_type: str, prompt_lengths: torch.Tensor, response_lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """`(B,)` the position whose value a critic reports: the last prompt token (`"v"`: V(prompt)) or the last
    completion token (`"q"`: Q(prompt, completion); the last prompt token for an empty completion).

    A causal model's value at a position reads only the tokens up to it, so V can be read from a forward over the
    whole sequence: the same value as CoMLRL's forward over the prompt alone (up to kernels' rounding), and the
    same forward as Q's or, for a head on the agent, as the actor's.

    >>> value_positions("v", torch.tensor([3, 5])).tolist()
    [2, 4]
    >>> value_positions("Q", torch.tensor([3, 5]), torch.tensor([2, 0])).tolist()
    [4, 4]
    """
    kind = critic_type.lower()
    if kind == "v":
        return prompt_lengths - 1
    if kind == "q":
        if response_lengths is None:
            raise ValueError("Q values sit at the last completion token: give response_lengths.")
        return prompt_lengths + response_lengths - 1
    raise ValueError(f"critic_type must be 'v' (V(prompt)) or 'q' (Q(prompt, completion)); got {critic_type!r}.")


def values_at(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`(B,)` row b's value at `positions[b]`, from per-position values `(B, T)`.

    >>> values_at(torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]), torch.tensor([2, 0])).tolist()
    [2.0, 3.0]
    """
    return values.gather(1, positions.long().view(-1, 1)).squeeze(1)


def joint_critic_text(prompts: Sequence[str], completions: Sequence[str] | None = None) -> str:
    """MAAC's critic input: every agent's prompt, and for Q (`completions` given) every agent's completion.

    The text is CoMLRL's: `[Agent i] <prompt>` blocks joined by blank lines, then for Q a `[Joint Action]` block
    and one `[Agent i action]` block per completion. CoMLRL tokenizes it with agent 0's tokenizer (truncated to
    its `model_max_length`, no chat template) and reads the value at its last token.

    >>> print(joint_critic_text(["Add 2+2.", "Check it."], ["4", "ok"]))
    [Agent 0] Add 2+2.
    <BLANKLINE>
    [Agent 1] Check it.
    <BLANKLINE>
    [Joint Action]
    <BLANKLINE>
    [Agent 0 action]
    4
    <BLANKLINE>
    [Agent 1 action]
    ok
    """
    text = "\n\n".join(f"[Agent {i}] {prompt}" for i, prompt in enumerate(prompts))
    if completions is None:
        return text
    blocks = ["[Joint Action]", *(f"[Agent {i} action]\n{completion}" for i, completion in enumerate(completions))]
    return text + "\n\n" + "\n\n".join(blocks)


# ---- 3. targets


def td_targets(
    rewards: torch.Tensor,
    old_values: torch.Tensor,
    discount: float = 1.0,
    played: torch.Tensor | None = None,
) -> torch.Tensor:
    """TD(0) targets over turns: `y_t = r_t + discount * V_old(t + 1)`, and `y_t = r_t` at the last turn played.

    Args:
        rewards: `(B, turns)` each turn's reward (after processors and any KL shaping).
        old_values: `(B, turns)` the critic's values at rollout time (the bootstrap is not recomputed).
        discount: Applies to the bootstrap only.
        played: `(B, turns)` bool, True for the turns played (a prefix of each row: an episode that stopped
            early); default all.

    Returns:
        `(B, turns)`, NaN at turns not played. With one turn: the rewards. Computed in float64 and returned in the
        rewards' dtype (at least float32), as CoMLRL's Python floats stored as float32 tensors.

    >>> r, v = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[10.0, 20.0, 30.0]])
    >>> td_targets(r, v, discount=0.5).tolist()
    [[11.0, 17.0, 3.0]]
    >>> td_targets(r, v, discount=0.5, played=torch.tensor([[True, True, False]])).tolist()  # stopped after turn 2
    [[11.0, 2.0, nan]]
    """
    played = torch.ones_like(rewards, dtype=torch.bool) if played is None else played.bool()
    r, v = rewards.double(), old_values.double()  # (B, turns)
    bootstrap = torch.zeros_like(r)
    next_played = torch.zeros_like(played)
    next_played[:, :-1] = played[:, 1:]
    bootstrap[:, :-1] = v[:, 1:]
    targets = torch.where(next_played, r + discount * bootstrap, r)
    targets = torch.where(played, targets, torch.full_like(targets, float("nan")))
    return targets.to(torch.promote_types(rewards.dtype, torch.float32))


def bootstrapped_targets(
    returns: torch.Tensor, old_values: torch.Tensor, successors: torch.Tensor, discount: float = 1.0
) -> torch.Tensor:
    """`(B,)` TD(0) targets of a rollout's rows from the returns the team core credits them with.

    On a trajectory a row's return is `G_t = r_t + discount * G_{t+1}`, so its TD target
    `r_t + discount * V_old(t + 1)` is `G_t + discount * (V_old(t + 1) - G_{t+1})`; a row with no successor (the
    last turn its episode played) keeps `G_t` (its reward, or with the core's `ended_return="stand"` the answer that
    stands for the remaining turns). The same targets as `td_targets`, for rows in any order.

    Args:
        returns: `(B,)` each row's return (NaN: no reward; a NaN next return counts as 0, as the core sums it).
        old_values: `(B,)` the critic's rollout-time values.
        successors: `(B,)` the row continuing each row's episode in the next turn, -1 for none.
        discount: Of the bootstrap.

    >>> returns = torch.tensor([1.0 + 0.5 * 2.0, 2.0])  # r = (1, 2) on one trajectory
    >>> bootstrapped_targets(returns, torch.tensor([10.0, 20.0]), torch.tensor([1, -1]), 0.5).tolist()
    [11.0, 2.0]
    """
    g, v = returns.double(), old_values.double()  # (B,)
    has_next = successors >= 0
    following = successors.clamp(min=0)
    bootstrap = discount * (v[following] - torch.nan_to_num(g[following]))
    targets = torch.where(has_next, g + bootstrap, g)
    return targets.to(torch.promote_types(returns.dtype, torch.float32))


def reward_to_go(rewards: torch.Tensor, played: torch.Tensor | None = None) -> torch.Tensor:
    """`(B, turns)` the undiscounted sum of the rewards from each turn on (CoMLRL's logged `expected_return`);
    NaN at turns not played.

    >>> reward_to_go(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[True, True, False]])).tolist()
    [[3.0, 2.0, nan]]
    """
    played = torch.ones_like(rewards, dtype=torch.bool) if played is None else played.bool()
    kept = torch.where(played, rewards, torch.zeros_like(rewards))
    totals = kept.flip(1).cumsum(1).flip(1)
    return torch.where(played, totals, torch.full_like(totals, float("nan")))


# ---- 4. advantages


def advantages(
    targets: torch.Tensor,
    old_values: torch.Tensor,
    normalize: bool = True,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """`(B,)` float32 advantages `y - V_old`; with `normalize`, standardized within each group.

    CoMLRL's normalization: `(A - mean(A)) / max(std(A), 1e-6)` with the population std, over the samples of one
    update (one agent, one turn, the whole buffer: across prompts, not per prompt group like GRPO); a group of one
    sample keeps its raw `A`.

    Args:
        targets: `(B,)` the targets y (`td_targets`, or the rewards for a single turn).
        old_values: `(B,)` the critic's values at rollout time.
        normalize: CoMLRL's `advantage_normalization`.
        groups: `(B,)` integer group of each row (e.g. agent * turns + turn); default: one group.

    A NaN target (no reward, a turn not played) gives advantage 0 and takes no part in its group's statistics.

    >>> advantages(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0.0, 0.0, 1.0]), normalize=False).tolist()
    [1.0, 2.0, 3.0]
    >>> [round(a, 4) for a in advantages(torch.tensor([1.0, 2.0, 4.0]), torch.zeros(3)).tolist()]
    [-1.069, -0.2673, 1.3363]
    >>> advantages(torch.tensor([1.0, 2.0]), torch.zeros(2), groups=torch.tensor([0, 1])).tolist()  # alone: raw
    [1.0, 2.0]
    """
    raw = targets.float() - old_values.float()  # (B,)
    result = raw.clone()
    if normalize:
        groups = torch.zeros_like(raw, dtype=torch.long) if groups is None else groups
        for group in groups.unique():
            rows = (groups == group) & ~torch.isnan(raw)
            if int(rows.sum()) > 1:
                members = raw[rows]
                std = members.std(unbiased=False).clamp(min=1e-6)
                result[rows] = (members - members.mean()) / std
    return torch.nan_to_num(result, nan=0.0)


def with_advantages(inputs: dict, advantages: torch.Tensor) -> dict:
    """TRL's GRPO batch `inputs` with `advantages` in place of GRPO's: the hook for a learned baseline.

    `GRPOTrainer._compute_loss` reads `inputs["advantages"]`, one per row (`(B,)`) or per token (`(B, T)`), in the
    order of `inputs["completion_ids"]`; everything else of its loss (ratio, clipping, `loss_type`, KL,
    `num_iterations`) applies unchanged.
    """
    rows = inputs["completion_ids"].shape[0]
    if advantages.dim() not in (1, 2) or advantages.shape[0] != rows:
        raise ValueError(
            f"Advantages must hold one value per row ({rows},) or per token ({rows}, T); "
            f"got {tuple(advantages.shape)}."
        )
    return {**inputs, "advantages": advantages.to(inputs["completion_ids"].device)}


# ---- 5. losses


def policy_gradient_loss(logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """CoMLRL's actor loss: `mean_b(-logp_b * A_b)` over sequence log-probabilities `(B,)` and detached advantages
    `(B,)` (cast to the log-probabilities' dtype). No ratio and no clipping: one policy-gradient step per batch.

    >>> policy_gradient_loss(torch.tensor([-1.0, -3.0]), torch.tensor([1.0, -1.0]))
    tensor(-1.)
    """
    return (-(logprobs * advantages.detach().to(logprobs.dtype))).mean()


def value_loss(
    values: torch.Tensor,
    targets: torch.Tensor,
    old_values: torch.Tensor | None = None,
    clip_range: float | None = None,
    coef: float = 1.0,
) -> torch.Tensor:
    """The critic's loss as CoMLRL computes it: `coef * mean_b(e_b)`, with no 1/2.

    `e_b = (y_b - v_b)^2`, or with `clip_range` c (and `old_values`), PPO's pessimistic clipped error
    `max((y_b - v_b)^2, (y_b - v_clip)^2)` where `v_clip = V_old + clamp(v_b - V_old, -c, c)`. CoMLRL clips only
    for IAC's head on the agent (`use_separate_critic=False` and `value_clip_range` set); its separate critics and
    MAAC's critic are never clipped, and `coef` (`value_loss_coef`) scales every critic's loss.

    Args:
        values: `(B,)` the critic's current values (with gradient).
        targets: `(B,)` y; cast to the values' dtype, as CoMLRL (pass `values.float()` for a float32 loss with a
            bf16 critic).
        old_values: `(B,)` V_old, needed to clip.
        clip_range: c; `None`: no clipping.
        coef: CoMLRL's `value_loss_coef`.

    >>> value_loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 0.0]), coef=0.5)
    tensor(2.5000)
    >>> value_loss(torch.tensor([1.0]), torch.tensor([0.0]), old_values=torch.tensor([0.0]), clip_range=0.2)
    tensor(1.)
    """
    targets = targets.to(device=values.device, dtype=values.dtype)
    errors = (targets - values) ** 2  # (B,)
    if clip_range is not None:
        if old_values is None:
            raise ValueError("Clipping the value loss needs the rollout-time values: give old_values.")
        old_values = old_values.to(device=values.device, dtype=values.dtype)
        clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        errors = torch.max(errors, (targets - clipped) ** 2)
    return coef * errors.mean()
