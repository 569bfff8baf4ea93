"""What a MADPO (and MARLHF reward-model) update computes, as pure functions on tensors, as in CoMLRL 1.4.3.

Shapes: N agents, B pairs (or rows), T positions (prompt then completion), V vocabulary.

1. Each agent's sequence log-probability of a completion: the sum over its tokens of log softmax of the raw logits
   (temperature 1), the completion cut at its first padding token (`trim_completion`, `pack_rows`,
   `sequence_logprobs`). CoMLRL's decentralized MADPO leaves the completion's last token unscored (the end-of-sequence
   token, or the last word of a completion cut at `max_new_tokens`); `drop_last_token=True` reproduces that, the
   default scores every token.
2. Each agent's log-ratio `delta_i = logp_i(winner) - logp_i(loser)`, reference-free as CoMLRL's MADPO, or against a
   frozen reference's log-probabilities in TRL's DPO convention (`preference_logratios`).
3. MADPO's joint-factorised DPO loss for agent i: `mean_p -logsigmoid(beta * (delta_i + sum_{j != i} delta_j))`, the
   other agents' terms detached, so that every agent is pushed by the team's joint margin but only through its own
   log-ratio (`joint_dpo_losses`). Summing the N losses and calling `backward` once gives each agent exactly the
   gradient of its own loss.
4. The reward model's Bradley-Terry loss `mean -logsigmoid(r_winner - r_loser)` (`bradley_terry_loss`), optionally
   with a margin that the winner must lead by (not CoMLRL's).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from trl.trainer.utils import selective_log_softmax

# ---- 1. sequence log-probabilities


def trim_completion(completion_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """A generated completion `(C,)` up to (not including) its first padding token, as CoMLRL keeps it.

    When the padding token is also the end-of-sequence token, the end token is therefore cut too.

    >>> trim_completion(torch.tensor([5, 6, 9, 0, 0]), pad_token_id=0).tolist()
    [5, 6, 9]
    >>> trim_completion(torch.tensor([5, 6]), pad_token_id=None).tolist()
    [5, 6]
    """
    if pad_token_id is None:
        return completion_ids
    pads = (completion_ids == pad_token_id).nonzero()
    return completion_ids if pads.numel() == 0 else completion_ids[: int(pads[0, 0])]


def pack_rows(
    prompt_ids: Sequence[torch.Tensor],
    completion_ids: Sequence[torch.Tensor],
    pad_token_id: int,
    drop_last_token: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows `prompt + completion`, padded on the right, for one forward over many (prompt, completion) pairs.

    Args:
        prompt_ids: B unpadded prompts `(P_b,)`.
        completion_ids: B completions `(C_b,)`, already trimmed (`trim_completion`).
        pad_token_id: Fills the rows' right ends.
        drop_last_token: Leave each completion's last token out of the scored mask (CoMLRL's decentralized MADPO).

    Returns:
        `input_ids (B, T)`, `attention_mask (B, T)` and `completion_mask (B, T)` (True at the scored tokens).

    >>> ids, attention, scored = pack_rows([torch.tensor([1, 2])], [torch.tensor([3, 4])], pad_token_id=0)
    >>> ids.tolist(), attention.tolist(), scored.int().tolist()
    ([[1, 2, 3, 4]], [[1, 1, 1, 1]], [[0, 0, 1, 1]])
    >>> pack_rows([torch.tensor([1, 2])], [torch.tensor([3, 4])], 0, drop_last_token=True)[2].int().tolist()
    [[0, 0, 1, 0]]
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"pack_rows got {len(prompt_ids)} prompts and {len(completion_ids)} completions.")
    if any(p.numel() == 0 for p in prompt_ids):
        raise ValueError("Each prompt needs at least one token: the first completion token is predicted from it.")
    width = max(p.numel() + c.numel() for p, c in zip(prompt_ids, completion_ids))
    device = prompt_ids[0].device
    input_ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long, device=device)  # (B, T)
    attention_mask = torch.zeros_like(input_ids)  # (B, T)
    completion_mask = torch.zeros_like(input_ids, dtype=torch.bool)  # (B, T)
    for b, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids)):
        start, end = prompt.numel(), prompt.numel() + completion.numel()
        input_ids[b, :end] = torch.cat([prompt, completion]).to(device)
        attention_mask[b, :end] = 1
        completion_mask[b, start : end - int(drop_last_token)] = True
    return input_ids, attention_mask, completion_mask


def sequence_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """`(B,)` each row's summed log-probability of its masked tokens: `sum_j mask[j] * log p(input_ids[j] | < j)`.

    Args:
        logits: `(B, T, V)` the model's raw logits on `input_ids` (position j predicts token j + 1): temperature 1,
            as CoMLRL scores preferences.
        input_ids: `(B, T)`.
        completion_mask: `(B, T)` the tokens to score (`pack_rows`); a row with nothing to score gets 0.

    >>> sequence_logprobs(torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]]), torch.tensor([[False, True, True]]))
    tensor([-2.7726])
    """
    token_logps = selective_log_softmax(logits[:, :-1], input_ids[:, 1:])  # (B, T-1): token j+1 from position j
    return token_logps.masked_fill(~completion_mask[:, 1:].bool(), 0.0).sum(dim=-1)  # (B,)


# ---- 2. log-ratios


def preference_logratios(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
) -> torch.Tensor:
    """The DPO log-ratio `(logp_w - logp_l) - (ref_logp_w - ref_logp_l)`, any shape (`(N, B)` for a team).

    Without reference log-probabilities it is reference-free, `logp_w - logp_l`, as CoMLRL's MADPO (no reference model
    anywhere). With them it is TRL's DPO `chosen_logratios - rejected_logratios`.

    >>> preference_logratios(torch.tensor([-1.0]), torch.tensor([-3.0])).tolist()
    [2.0]
    >>> preference_logratios(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-3.5]))
    tensor([0.5000])
    """
    if (ref_chosen_logps is None) != (ref_rejected_logps is None):
        raise ValueError("Give both reference log-probabilities (chosen and rejected) or neither.")
    delta = chosen_logps - rejected_logps
    if ref_chosen_logps is not None:
        delta = delta - (ref_chosen_logps - ref_rejected_logps)
    return delta


# ---- 3. MADPO's joint-factorised DPO loss


JOINT_DPO_LOSS_TYPES = ("sigmoid", "hinge")  # TRL's DPO losses that are a function of the margin alone


def joint_dpo_losses(logratios: torch.Tensor, beta: float = 0.1, loss_type: str = "sigmoid") -> torch.Tensor:
    """`(N,)` each agent's MADPO loss on the team's joint margin `m(p) = beta * (delta_i(p) + sum_{j != i}
    delta_j(p).detach())`: `mean_p -logsigmoid(m)` (`"sigmoid"`, DPO's and CoMLRL's) or `mean_p relu(1 - m)`
    (`"hinge"`, TRL's DPO hinge loss, SLiC).

    Args:
        logratios: `(N, B)` agent i's log-ratio on pair p (`preference_logratios`); row i carries agent i's graph.
        beta: DPO's inverse temperature (CoMLRL's `dpo_beta`, > 0).
        loss_type: One of `JOINT_DPO_LOSS_TYPES`. (TRL's other DPO losses read more than the margin, e.g. IPO's
            per-token normalization, and have no joint form here.)

    The value of every agent's joint margin is the same, `sum_j delta_j(p)`; its gradient reaches agent i only
    through `delta_i`: for `"sigmoid"`, `d loss_i = -(beta / B) * sum_p sigmoid(-beta * sum_j delta_j(p)) * d
    delta_i(p)`.

    >>> deltas = torch.tensor([[1.0, -2.0], [3.0, 0.0]], requires_grad=True)  # 2 agents, 2 pairs
    >>> losses = joint_dpo_losses(deltas, beta=1.0)
    >>> torch.allclose(losses[0], losses[1])  # the same joint margins 4 and -2
    True
    >>> losses.sum().backward()
    >>> torch.allclose(deltas.grad[0], deltas.grad[1])  # each row gets its own loss's gradient only
    True
    >>> joint_dpo_losses(torch.tensor([[0.5, 3.0]]), beta=1.0, loss_type="hinge").tolist()  # relu(1 - m), mean
    [0.25]
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0; got {beta}.")
    if logratios.dim() != 2:
        raise ValueError(f"logratios must be (num_agents, num_pairs); got shape {tuple(logratios.shape)}.")
    if loss_type not in JOINT_DPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {JOINT_DPO_LOSS_TYPES}; got {loss_type!r}.")
    detached = logratios.detach()  # (N, B)
    others = detached.sum(dim=0, keepdim=True) - detached  # (N, B): the other agents' terms, no gradient
    margins = beta * (logratios + others)  # (N, B)
    if loss_type == "hinge":
        return torch.relu(1 - margins).mean(dim=1)  # (N,)
    return -F.logsigmoid(margins).mean(dim=1)  # (N,)


# ---- 4. the reward model's loss


def bradley_terry_loss(
    chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """The reward model's pairwise loss `mean -logsigmoid(r_w - r_l - margin)` over `(B,)` scores (a scalar).

    `margin` `(B,)` (default none, CoMLRL's loss) asks each pair's winner to lead by that much: Llama 2's reward-model
    margin, e.g. a multiple of the pair's task-reward gap (`train_reward_model(margin_scale=...)`).

    >>> round(bradley_terry_loss(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])).item(), 4)  # log 2
    0.6931
    >>> round(bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0]), margin=torch.tensor([2.0])).item(), 4)
    0.6931
    """
    differences = chosen_scores - rejected_scores  # (B,)
    if margin is not None:
        differences = differences - margin.to(differences)
    return -F.logsigmoid(differences).mean()


__all__ = [
    "JOINT_DPO_LOSS_TYPES",
    "bradley_terry_loss",
    "joint_dpo_losses",
    "pack_rows",
    "preference_logratios",
    "sequence_logprobs",
    "trim_completion",
]
