"""Bad settings and inputs refused early, naming the setting: non-finite numbers in every family's config, a
non-finite loss during training, CoMLRL's `batch_items` rewards in the actor-critic trainers, and raw errors that
named no setting."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from multiagent_trl import MultiAgentGRPOConfig
from multiagent_trl.actor_critic.config import ActorCriticConfig
from multiagent_trl.comlrl import (
    CentralizedMAGRPOConfig,
    IACConfig,
    MAACConfig,
    MADPOConfig,
    MADPOIterConfig,
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLHFConfig,
    MARLHFIterConfig,
    MARLOOConfig,
)
from multiagent_trl.preference.config import MultiAgentDPOConfig

CONFIGS = [
    MultiAgentGRPOConfig,
    ActorCriticConfig,
    MultiAgentDPOConfig,
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
    CentralizedMAGRPOConfig,
    IACConfig,
    MAACConfig,
    MADPOConfig,
    MADPOIterConfig,
    MARLHFConfig,
    MARLHFIterConfig,
]


def float_fields(config_class) -> list[tuple[str, bool]]:
    """`(name, takes a list)` of every field of `config_class` typed as a float (TRL's, the team's, CoMLRL's)."""
    found = []
    for f in dataclasses.fields(config_class):
        kind = str(f.type)
        if f.init and re.search(r"\bfloat\b", kind):
            found.append((f.name, "list[" in kind))
    return found


def test_the_table_covers_the_settings_users_set():
    names = {name for cls in CONFIGS for name, _ in float_fields(cls)}
    for name in (
        "learning_rate",
        "beta",
        "epsilon",
        "temperature",
        "top_p",
        "max_grad_norm",
        "discount",
        "critic_learning_rate",
        "value_loss_coef",
        "dpo_beta",
        "agent_learning_rate",
        "reward_learning_rate",
    ):
        assert name in names


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_non_finite_settings_are_refused_naming_the_field(tmp_path, config_class, value):
    accepted = []
    for name, listed in float_fields(config_class):
        given = [value] if listed else value
        try:
            config_class(output_dir=str(tmp_path), report_to="none", **{name: given})
        except ValueError as error:
            if f"`{name}`" not in str(error) or "finite" not in str(error):
                accepted.append(f"{name}: {error}")
        else:
            accepted.append(f"{name}: accepted")
    assert not accepted, "\n".join(accepted)
