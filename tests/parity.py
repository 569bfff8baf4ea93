"""Tolerances of the parity tests (ours against CoMLRL 1.4.3 or TRL), stated once above the rounding noise.

Two computations of the same math differ by float32 rounding, and that rounding depends on the CPU (vector width,
the kernel ATen picks: ATEN_CPU_CAPABILITY), the thread count and the batch layout. A parity test must hold on any
machine that runs CI, so each tolerance below sits about 10x above the noise measured by
`benchmarks/parity_noise.py` (CoMLRL, TRL and ours each against itself under 1 and 2 threads and the `default` and
`avx2` kernel sets, and ours against theirs under each), and well below what a real error moves (a 1% change of a
loss coefficient moves a gradient by 1e-2 of its scale).

Gradients are compared to the scale of the whole tensor (`max |theirs|`), not element by element: a near-zero entry
(1e-12 next to entries of 1e-3) carries only rounding noise, which an element-wise rtol reads as a mismatch.

With PARITY_RECORD=<folder> set, every comparison saves both sides there, for `benchmarks/parity_noise.py`.
"""

from __future__ import annotations

import hashlib
import os

import torch

# ---- the measured noise floors: benchmarks/parity_noise.py on an AMD EPYC (AVX2, no AVX-512), torch 2.13 CPU, each
# test's tensors under OMP_NUM_THREADS 1 and 2 x ATEN_CPU_CAPABILITY default and avx2. A floor is the max over every
# tensor, test and setting of (max |a - b| - atol) / max |b|; "itself": one library's side under each setting against
# 1 thread / default.

# Gradients (ours from backward; theirs read back as minus one SGD(lr=1) step, or lr x gradient).
# Noise floor: CoMLRL vs itself 1.9e-6, ours vs itself 1.9e-6, ours vs CoMLRL 2.0e-6 (bradley-terry; the AC steps
# 1.4e-6). Tolerance 10x.
GRADIENT_REL = 2e-5
# Forward outputs (sequence log-probabilities, values, advantages, reward scores, losses).
# Noise floor: CoMLRL vs itself 4.2e-7, ours vs itself 1.2e-6 (reward scores of an iterative run), ours vs CoMLRL
# 4.4e-7. Tolerance ~10x.
FORWARD_REL = 1e-5
# The absolute floor under either: a tensor whose scale is ~1e-9 (a gradient zero up to rounding) passes. Where a
# side is read back from float32 weights, `weight_rounding` (an ulp of the largest weight) is added.
TINY = 1e-9


def _record(actual: torch.Tensor, expected: torch.Tensor, kind: str, msg: str, atol: float = 0.0) -> None:
    """Save both sides under PARITY_RECORD, keyed by the running test and `msg` (for benchmarks/parity_noise.py)."""
    folder = os.environ.get("PARITY_RECORD")
    if not folder:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    key = f"{test}::{msg}"
    seen = _record.counts.get(key, 0)  # a test may compare the same name twice (two agents, two steps)
    _record.counts[key] = seen + 1
    key = f"{key}#{seen}"
    os.makedirs(folder, exist_ok=True)
    name = hashlib.sha1(key.encode()).hexdigest()[:16]
    actual, expected = actual.detach().cpu().clone(), expected.detach().cpu().clone()
    data = {"key": key, "kind": kind, "atol": atol, "actual": actual, "expected": expected}
    torch.save(data, os.path.join(folder, f"{name}.pt"))


_record.counts = {}


def assert_close_to_scale(actual, expected, rel: float, *, atol: float = TINY, msg: str = "", kind: str = "") -> None:
    """`max |actual - expected| <= rel * max |expected| + atol`: equal up to rounding at the tensor's own scale."""
    actual, expected = torch.as_tensor(actual).detach(), torch.as_tensor(expected).detach()
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    _record(actual, expected, kind or ("gradient" if rel == GRADIENT_REL else "forward"), msg, atol)
    diff = (actual.double() - expected.double()).abs().max().item() if expected.numel() else 0.0
    scale = expected.double().abs().max().item() if expected.numel() else 0.0
    assert diff <= rel * scale + atol, (
        f"{msg}: max |diff| {diff:.3g} > {rel:g} x max |expected| {scale:.3g} + {atol:.3g}"
    )


def weight_rounding(weights: torch.Tensor) -> float:
    """The rounding of a step read back as `after - before` of float32 weights: an ulp of the largest weight."""
    return torch.finfo(torch.float32).eps * weights.detach().abs().max().item() if weights.numel() else 0.0


def assert_same_gradients(actual: dict, expected: dict, prefix: str = "", weights: dict | None = None) -> None:
    """Every tensor of `actual` equals `expected`'s (name to gradient) up to GRADIENT_REL of its scale; where one
    side is a step read back from float32 `weights` (SGD), up to that weight's rounding too."""
    assert actual.keys() == expected.keys(), prefix
    for name in expected:
        atol = TINY + (weight_rounding(weights[name]) if weights is not None else 0.0)
        assert_close_to_scale(actual[name], expected[name], GRADIENT_REL, atol=atol, msg=f"{prefix}{name}")


def assert_same_forward(actual, expected, msg: str = "") -> None:
    """Forward outputs (log-probabilities, values, scores, losses) equal up to FORWARD_REL of their scale."""
    assert_close_to_scale(actual, expected, FORWARD_REL, msg=msg)


# ---- after Adam / AdamW

# Adam's step is about lr * m / sqrt(v): a gradient within rounding of zero (1e-12 against 2e-12) moves its weight
# by up to lr either way, so weights after Adam cannot agree element by element on every CPU. Nearly every weight
# must agree to ADAM_CLOSE, and every one to ADAM_MAX_STEPS; a wrong order, rate, decay or data moves most weights.
# Noise floor (per test run and setting, CoMLRL / TRL / ours vs itself and ours vs theirs): at most 2.8e-5 of the
# weights off by more than 1e-3 lr, none by more than 0.086 lr. Tolerances: 3e-4 of them (~10x), and lr per step
# (~12x; the most Adam's first step moves a weight).
ADAM_CLOSE = 1e-3  # x lr
ADAM_OFF_SHARE = 3e-4
ADAM_MAX_STEPS = 1.0  # x lr x steps


def assert_same_update(pairs, lr: float, steps: int = 1) -> None:
    """The same weights after `steps` Adam(W) steps at rate `lr`: `pairs` holds (name, our module, their module)."""
    total = off = 0
    for name, ours, theirs in pairs:
        mine, their = dict(ours.named_parameters()), dict(theirs.named_parameters())
        assert mine.keys() == their.keys(), name
        for key in mine:
            _record(mine[key], their[key], "adam", f"{name}.{key}", lr)
            diff = (mine[key].detach() - their[key].detach()).abs()
            assert diff.max() <= ADAM_MAX_STEPS * steps * lr, f"{name}.{key}: {diff.max():.3g}"
            total, off = total + diff.numel(), off + int((diff > ADAM_CLOSE * lr).sum())
    assert off <= ADAM_OFF_SHARE * total, f"{off} of {total} weights differ by more than {ADAM_CLOSE * lr:g}"
