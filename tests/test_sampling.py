"""`TopKTopPLogitsWarper` (top-p over the top-k survivors, `rollout.sampling`) keeps exactly the tokens of
transformers' top-k and top-p warpers, and samples the same tokens under a seed."""

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from multiagent_trl.rollout.sampling import TopKTopPLogitsWarper, use_top_k_top_p

QWEN_VOCAB = 151936


def both(scores: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(scores.size(0), 1, dtype=torch.long)
    k, p = TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)
    return p(ids, k(ids, scores)), TopKTopPLogitsWarper(k, p)(ids, scores)


@pytest.mark.parametrize("vocab", [258, 1000, QWEN_VOCAB])
@pytest.mark.parametrize(("top_k", "top_p"), [(50, 0.6), (50, 0.95), (5, 0.3), (64, 0.6), (200, 0.9)])
def test_same_scores_as_transformers(vocab, top_k, top_p):
    generator = torch.Generator().manual_seed(vocab + top_k)
    ids = torch.zeros(64, 1, dtype=torch.long)
    for scale in (0.5, 2.0, 8.0):  # flat to peaked distributions, after the tutorial's temperature
        logits = torch.randn(64, vocab, generator=generator) * scale
        scores = TemperatureLogitsWarper(0.6)(ids, logits)
        theirs, ours = both(scores, top_k, top_p)
        assert torch.equal(theirs, ours)
        assert (theirs > -float("inf")).sum(-1).min() >= 1
        # the same tokens sampled under a seed
        draws = []
        for processed in (theirs, ours):
            torch.manual_seed(0)
            draws.append(torch.multinomial(processed.softmax(-1), 1))
        assert torch.equal(*draws)


def test_boundary_cases_fall_back_to_transformers():
    ids = torch.zeros(3, 1, dtype=torch.long)
    scores = torch.randn(3, 1000)
    scores[0, :10] = 5.0  # ties among the survivors
    scores[1, 10:] = -float("inf")  # fewer finite scores than top_k
    scores[2, :60] = 3.0  # ties at the top-k boundary
    theirs, ours = both(scores, 50, 0.6)
    assert torch.equal(theirs, ours)
    del ids


def test_sampled_tokens_of_generate_are_unchanged(tiny_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with torch.no_grad():  # peaked, varied next-token distributions, so that top-p cuts inside the top-k
        model.get_output_embeddings().weight.mul_(40)
    prompts = torch.randint(3, 250, (16, 6), generator=torch.Generator().manual_seed(0))
    settings = dict(do_sample=True, temperature=0.6, top_k=50, top_p=0.6, max_new_tokens=24, min_new_tokens=24)
    outputs = []
    for patched in (False, True):
        if patched:
            use_top_k_top_p(model)
        torch.manual_seed(0)
        outputs.append(model.generate(prompts, attention_mask=torch.ones_like(prompts), **settings))
    processors = model._get_logits_processor(model.generation_config.__class__(**settings))
    assert any(isinstance(p, TopKTopPLogitsWarper) for p in processors)
    assert not any(type(p) in (TopKLogitsWarper, TopPLogitsWarper) for p in processors)
    assert torch.equal(outputs[0], outputs[1])
    assert len(set(outputs[0][:, 6:].flatten().tolist())) > 5  # varied tokens: the equality is not trivial
