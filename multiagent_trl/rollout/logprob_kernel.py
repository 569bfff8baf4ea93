"""A faster CPU fallback for TRL's chunked log-prob kernel, with the same bits out.

TRL computes the log-probs (and entropies) of the loss with `trl.kernels.chunked_logprob.ChunkedLogProbFunction`,
which projects the hidden states on the vocabulary tile by tile. On GPUs a Triton kernel folds each tile; elsewhere
TRL calls torch fallbacks (`_forward_tile`, `_backward_tile`) written for clarity: each step of the formula makes a
new tensor of the tile's size (`[tokens, 32768]` floats, 64 MB for 512 tokens). With a real vocabulary, the
backward's fallback alone took 34-44% of the tutorial epoch on a CPU (`benchmarks/profile_epoch.py`).

`faster_backward_tile` computes the same gradient of the log-probs with the same float operations in the same order,
in place in the tile (which TRL overwrites with the gradient anyway) and a few rows at a time, so that the rows stay
in cache across the steps: elementwise operations give each element the same bits whatever the block, so the
gradients are bit-identical to TRL's (`tests/test_logprob_kernel.py`). Cases it does not cover (a soft-capped head, a
gradient through the entropy, the entropy bonus) go to TRL's own fallback.

`faster_forward_tile` does the same for the forward's fold of each tile into the online log-sum-exp (and the
entropy's) statistics: the scaled logits in place, one temporary instead of four, the reductions over the same
tensors as TRL's, so they sum in the same order.

`use_faster_cpu_kernel()` installs both in TRL's module (the Triton path is not touched); since the results are the
same, TRL's own trainers in the process compute what they did before.
"""

from __future__ import annotations

import inspect

import torch

ROWS_PER_BLOCK = 16  # 16 rows of a 32768-column float32 tile: 2 MB, about an L2 cache


def faster_backward_tile(
    tile, tile_stride, targets, log_z, entropy, grad_logprobs, grad_entropy, vocab_start, n_cols, logit_scale, softcap,
    inv_t, HAS_SOFTCAP, HAS_LOGPROB_GRAD, HAS_ENTROPY_GRAD, BLOCK_SIZE,
):  # fmt: skip
    """TRL's `_backward_tile` (same arguments, same result in `tile`) for the log-prob gradient alone."""
    if HAS_SOFTCAP or HAS_ENTROPY_GRAD or not HAS_LOGPROB_GRAD:
        return _original_backward_tile(
            tile, tile_stride, targets, log_z, entropy, grad_logprobs, grad_entropy, vocab_start, n_cols, logit_scale,
            softcap, inv_t, HAS_SOFTCAP, HAS_LOGPROB_GRAD, HAS_ENTROPY_GRAD, BLOCK_SIZE,
        )  # fmt: skip
    local = targets - vocab_start
    in_tile = (local >= 0) & (local < n_cols)
    for start in range(0, tile.size(0), ROWS_PER_BLOCK):
        rows = slice(start, start + ROWS_PER_BLOCK)
        block = tile[rows].float()  # the tile itself when it is float32
        # TRL: z = tile.float() * logit_scale * inv_t; p = exp(z - log_z) (x * 1.0 is x)
        if logit_scale != 1.0:
            block.mul_(logit_scale)
        block.mul_(inv_t).sub_(log_z[rows].unsqueeze(-1)).exp_()
        # TRL: grad = 0 + grad_logprobs * (is_target - p): -p off the target (0 - p is -p), 1 - p on it
        hit = in_tile[rows].nonzero().squeeze(-1)
        columns = local[rows][hit]
        target_p = block[hit, columns]
        block.neg_()
        block[hit, columns] = 1.0 - target_p
        block.mul_(grad_logprobs[rows].unsqueeze(-1)).mul_(inv_t)
        if logit_scale != 1.0:
            block.mul_(logit_scale)
        if block.data_ptr() != tile.data_ptr() + start * tile.stride(0) * tile.element_size():
            tile[rows].copy_(block)


def faster_forward_tile(
    tile, tile_stride, targets, running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit,
    vocab_start, n_cols, logit_scale, softcap, inv_t, HAS_SOFTCAP, HAS_ENTROPY, HAS_LOG_SUM_SQ_PROBS, HAS_MEAN_LOGITS,
    HAS_IS_TOP1, BLOCK_SIZE,
):  # fmt: skip
    """TRL's `_forward_tile` (same arguments, same statistics out) for the log-probs and entropies: the scaled logits
    in place in the tile (TRL's scratch buffer) and one temporary instead of four; the reductions run over the same
    tensors as TRL's, so they sum in the same order."""
    if HAS_SOFTCAP or HAS_LOG_SUM_SQ_PROBS or HAS_MEAN_LOGITS or HAS_IS_TOP1:
        return _original_forward_tile(
            tile, tile_stride, targets, running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target,
            target_logit, vocab_start, n_cols, logit_scale, softcap, inv_t, HAS_SOFTCAP, HAS_ENTROPY,
            HAS_LOG_SUM_SQ_PROBS, HAS_MEAN_LOGITS, HAS_IS_TOP1, BLOCK_SIZE,
        )  # fmt: skip
    z = tile.float()  # TRL: z = tile.float() * logit_scale * inv_t (x * 1.0 is x)
    if logit_scale != 1.0:
        z.mul_(logit_scale)
    z.mul_(inv_t)
    local = targets - vocab_start
    in_tile = (local >= 0) & (local < n_cols)
    target_z = z.gather(-1, local.clamp(0, n_cols - 1).unsqueeze(-1)).squeeze(-1)
    new_m = torch.maximum(running_max, z.amax(-1))
    rescale = torch.exp(running_max - new_m)
    e = torch.sub(z, new_m.unsqueeze(-1)).exp_()
    sum_exp.mul_(rescale).add_(e.sum(-1))
    if HAS_ENTROPY:
        x_sum_exp.mul_(rescale).add_(e.mul_(z).sum(-1))
    running_max.copy_(new_m)
    target_logit.copy_(torch.where(in_tile, target_z, target_logit))


_original_backward_tile = _original_forward_tile = None


def use_faster_cpu_kernel() -> bool:
    """Make TRL's chunked log-prob kernel use `faster_backward_tile` and `faster_forward_tile` where it uses its torch
    fallbacks (idempotent). They mirror private TRL functions, so they are installed only where TRL's have the same
    parameters (TRL 1.16's); a TRL release that changes them keeps its own. Returns whether they are installed."""
    global _original_backward_tile, _original_forward_tile
    from trl.kernels import chunked_logprob

    if chunked_logprob._backward_tile is faster_backward_tile:
        return True
    for ours, name in ((faster_backward_tile, "_backward_tile"), (faster_forward_tile, "_forward_tile")):
        theirs = getattr(chunked_logprob, name, None)
        if theirs is None or list(inspect.signature(theirs).parameters) != list(inspect.signature(ours).parameters):
            return False
    _original_backward_tile, _original_forward_tile = chunked_logprob._backward_tile, chunked_logprob._forward_tile
    chunked_logprob._backward_tile, chunked_logprob._forward_tile = faster_backward_tile, faster_forward_tile
    return True
