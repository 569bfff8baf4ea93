"""Top-k then top-p sampling without sorting the whole vocabulary, with the same kept tokens as transformers.

transformers' `TopPLogitsWarper` sorts every row of scores, the whole vocabulary, at every decoding step, even right
after `TopKLogitsWarper` has left only `top_k` finite scores in it. With a real vocabulary (151,936 tokens for
Qwen2.5) that sort is the costliest part of sampling on a CPU: about 150 ms per step for 32 rows on one thread,
against 40 ms for the LM head itself.

`TopKTopPLogitsWarper` applies both warpers in one: transformers' top-k, then top-p over the `top_k` survivors only.
After top-k, the ascending sort of a row is `-inf` everywhere but its last `top_k` places, which hold the survivors
in ascending order (when the survivors are exactly `top_k` and distinct). So the warper builds that tail in a short
row of `-inf`s whose length is congruent to the vocabulary's modulo 64, and takes the same softmax and cumulative sum
over it: on a CPU, where softmax sums a row in SIMD lanes by position, every survivor then falls in the same lane as
in the full row and the other terms are exact zeros, so the probabilities, the cumulative sums and the kept tokens are
the same bits (`tests/test_sampling.py` checks the kept scores and the sampled tokens against transformers'
processors). Anywhere else (an accelerator, where sorting is cheap; a row with ties at the boundary or fewer than
`top_k` finite scores) it calls transformers' two warpers, unchanged.

`use_top_k_top_p(model)` makes a model's `generate` use it in place of transformers' adjacent top-k and top-p warpers.
"""

from __future__ import annotations

import functools

import torch
from transformers.generation.logits_process import LogitsProcessor, TopKLogitsWarper, TopPLogitsWarper

LANES = 64  # a multiple of every CPU SIMD width softmax uses for float32 (8 for AVX2, 16 for AVX-512)


class TopKTopPLogitsWarper(LogitsProcessor):
    """transformers' `TopKLogitsWarper` followed by its `TopPLogitsWarper`, the top-p over the top-k survivors only
    (see the module's docstring); the same scores out, bit for bit.

    Args:
        top_k: transformers' top-k warper.
        top_p: transformers' top-p warper, applied after it.
    """

    def __init__(self, top_k: TopKLogitsWarper, top_p: TopPLogitsWarper):
        self.top_k, self.top_p = top_k, top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.size(-1)
        k = min(self.top_k.top_k, vocab)
        short = k + (vocab - k) % LANES
        short += LANES if short < LANES else 0
        if scores.device.type != "cpu" or scores.dim() != 2 or short >= vocab:
            return self.top_p(input_ids, self.top_k(input_ids, scores))
        # transformers' top-k, keeping its `topk` values and indices
        values, indices = torch.topk(scores, k)
        removed = scores < values[..., -1, None]
        after_k = scores.masked_fill(removed, self.top_k.filter_value)
        exact_tail = (removed.sum(-1) == vocab - k).all() and (values[..., :-1] > values[..., 1:]).all()
        if not exact_tail:  # ties at the boundary or among the survivors, or fewer than k finite scores
            return self.top_p(input_ids, after_k)
        # The tail of transformers' ascending sort, in a short row with the survivors in the same SIMD lanes
        tail = values.new_full((values.size(0), short), -float("inf"))
        tail[:, short - k :] = values.flip(-1)
        cumulative_probs = tail.softmax(dim=-1).cumsum(dim=-1)
        tail_removed = cumulative_probs <= (1 - self.top_p.top_p)
        tail_removed[..., -self.top_p.min_tokens_to_keep :] = 0
        survivors_removed = tail_removed[:, short - k :].flip(-1)  # back in `indices`' (descending) order
        kept = torch.where(survivors_removed, torch.full_like(values, self.top_p.filter_value), values)
        return after_k.scatter(-1, indices, kept)


def _top_k_top_p(processors: list) -> list:
    """`processors` with each adjacent transformers top-k, top-p pair replaced by one `TopKTopPLogitsWarper`."""
    for i in range(len(processors) - 1):
        first, second = processors[i], processors[i + 1]
        if type(first) is TopKLogitsWarper and type(second) is TopPLogitsWarper:
            processors[i : i + 2] = [TopKTopPLogitsWarper(first, second)]
            break
    return processors


def use_top_k_top_p(model) -> None:
    """Make `model.generate` (a transformers model, or a PEFT model around one) apply top-k then top-p through
    `TopKTopPLogitsWarper`: the same tokens sampled under a seed, without sorting the vocabulary on a CPU."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(model, "_uses_top_k_top_p", False) or not hasattr(model, "_get_logits_processor"):
        return
    original = model._get_logits_processor

    @functools.wraps(original)
    def get_logits_processor(*args, **kwargs):
        return _top_k_top_p(original(*args, **kwargs))

    model._get_logits_processor = get_logits_processor
    model._uses_top_k_top_p = True
