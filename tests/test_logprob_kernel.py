"""`multiagent_trl.rollout.logprob_kernel`: TRL's chunked log-prob kernel with the faster CPU tiles gives the same bits
(log-probs, entropies and both gradients) as with TRL's own torch fallbacks."""

import pytest
import torch
from trl.kernels import chunked_logprob

from multiagent_trl.rollout import logprob_kernel


def run(tiles, monkeypatch, *, bias: bool, logit_scale: float, softcap: float | None, outputs):
    monkeypatch.setattr(chunked_logprob, "_forward_tile", tiles[0])
    monkeypatch.setattr(chunked_logprob, "_backward_tile", tiles[1])
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(70, 32, generator=generator).requires_grad_()
    weight = (torch.randn(70000, 32, generator=generator) * 0.1).requires_grad_()  # 3 vocab chunks, the last partial
    b = (torch.randn(70000, generator=generator) * 0.1).requires_grad_() if bias else None
    targets = torch.randint(0, 70000, (70,), generator=generator)
    log_probs, entropy, *_ = chunked_logprob.ChunkedLogProbFunction.apply(
        hidden, weight, b, targets, 0.6, 32768, softcap, logit_scale, outputs
    )
    (log_probs * torch.linspace(-1, 1, 70)).sum().backward()
    grads = [hidden.grad, weight.grad] + ([b.grad] if bias else [])
    return [log_probs, entropy, *grads]


@pytest.mark.parametrize(
    ("bias", "logit_scale", "softcap"), [(False, 1.0, None), (True, 0.5, None), (False, 1.0, 30.0)]
)
def test_same_bits_as_trl_fallback(monkeypatch, bias, logit_scale, softcap):
    logprob_kernel.use_faster_cpu_kernel()
    assert chunked_logprob._backward_tile is logprob_kernel.faster_backward_tile
    originals = (logprob_kernel._original_forward_tile, logprob_kernel._original_backward_tile)
    faster = (logprob_kernel.faster_forward_tile, logprob_kernel.faster_backward_tile)
    assert originals != faster
    for outputs in (("log_probs", "entropy"), ("log_probs",)):
        theirs = run(originals, monkeypatch, bias=bias, logit_scale=logit_scale, softcap=softcap, outputs=outputs)
        ours = run(faster, monkeypatch, bias=bias, logit_scale=logit_scale, softcap=softcap, outputs=outputs)
        for a, b in zip(theirs, ours, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a, b)
        assert theirs[2].abs().sum() > 0 and theirs[3].abs().sum() > 0


def test_entropy_gradient_goes_to_trl(monkeypatch):
    """A gradient through the entropy (TRL's entropy bonus) is TRL's own fallback's: the same gradients."""
    logprob_kernel.use_faster_cpu_kernel()
    results = []
    for tiles in (
        (logprob_kernel._original_forward_tile, logprob_kernel._original_backward_tile),
        (logprob_kernel.faster_forward_tile, logprob_kernel.faster_backward_tile),
    ):
        monkeypatch.setattr(chunked_logprob, "_forward_tile", tiles[0])
        monkeypatch.setattr(chunked_logprob, "_backward_tile", tiles[1])
        hidden = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).requires_grad_()
        weight = torch.randn(40000, 16, generator=torch.Generator().manual_seed(2)).requires_grad_()
        targets = torch.arange(8) * 4000
        log_probs, entropy, *_ = chunked_logprob.ChunkedLogProbFunction.apply(
            hidden, weight, None, targets, 1.0, 32768, None, 1.0, ("log_probs", "entropy")
        )
        (log_probs.sum() + 0.1 * entropy.sum()).backward()
        results.append((hidden.grad, weight.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_a_trl_with_other_tile_functions_keeps_its_own(monkeypatch):
    """The tiles mirror private TRL 1.16 functions: a TRL whose functions take other parameters is left alone."""

    def changed_backward(tile, targets, log_z):
        return None

    monkeypatch.setattr(chunked_logprob, "_backward_tile", changed_backward)
    assert logprob_kernel.use_faster_cpu_kernel() is False
    assert chunked_logprob._backward_tile is changed_backward
