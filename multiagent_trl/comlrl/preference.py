"""CoMLRL 1.4.3's `MADPOConfig`/`MADPOTrainer` (decentralized, or centralized: one model writes every role) translated
onto `MultiAgentDPOConfig`/`MultiAgentDPOTrainer`; `docs/comlrl-users.md` (MADPO) maps every name and lists the
deliberate differences from CoMLRL."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

from ..preference.config import MultiAgentDPOConfig
from ..preference.trainer import DPO_TAG_NAMES, MultiAgentDPOTrainer
from .behaviour import as_one_actor, comparator_adapter, decay_every_parameter, with_keywords
from .fields import (
    CoMLRLOptimization,
    CoMLRLPreferenceFields,
    CoMLRLShared,
    check_fields,
    check_parallel,
    comlrl_config,
    confirm_devices,
    map_shared,
)
from .reinforce import MAGRPOTrainer

logger = logging.getLogger(__name__)

# MAGRPO's fields that CoMLRL's MADPOConfig accepts and its MADPO never reads (single turn, no advantages, the W&B
# x-axis): accepted here too, with a warning when set to another value than `MADPOConfig`'s default.
UNUSED_FIELDS = ("discount", "early_termination_threshold", "external_prompt_passthrough", "advantage_normalization")
UNUSED_FIELDS += ("advantage_mode", "reference_kl_coef", "reference_devices", "use_environment_step")
UNUSED_FIELDS += ("environment_steps_per_pair",)


@comlrl_config("MADPOConfig")
@dataclass
class MADPOConfig(CoMLRLOptimization, CoMLRLShared, CoMLRLPreferenceFields, MultiAgentDPOConfig):
    """`MultiAgentDPOConfig` accepting every field of CoMLRL 1.4.3's `MADPOConfig`, with its defaults and checks
    (the table `fields.FAMILIES["MADPOConfig"]`, rendered in `docs/comlrl-users.md`). With
    `collaboration_mode="centralized"`, `num_agents` counts the roles and per-agent settings are the one model's."""

    output_dir: str | None = "madpo_output"
    # CoMLRL 1.4.3's fields, in its order; `UNUSED_FIELDS` are accepted and unused, as in CoMLRL's MADPO.
    num_train_epochs: float = 20
    logging_steps: float = 50
    collaboration_mode: str = "decentralized"
    num_turns: int = 1
    discount: float = 1.0
    joint_mode: str = "aligned"
    early_termination_threshold: float | None = None
    external_prompt_passthrough: bool = False
    advantage_normalization: bool = True
    advantage_mode: str = "mean"
    reference_kl_enabled: bool = False
    reference_kl_coef: float = 0.1
    reference_devices: list[str] | None = None

    def __post_init__(self):
        self._check_comlrl_fields()
        as_one_actor(self, self._map_fields)

    def _map_fields(self) -> None:
        """CoMLRL's fields onto the core's, then the core's own checks."""
        self.num_generations = self.preference_num_candidates
        self.per_device_train_batch_size, self.steps_per_generation, self.pair_steps_per_generation = (
            self._generation_batch()
        )
        self.generation_batch_size = None  # TRL derives it from the two above
        given = map_shared(self, {"agent_devices": self.num_agents, "reference_devices": 0})
        super().__post_init__()
        confirm_devices(self, {"agent_devices": given["agent_devices"]})

    def _generation_batch(self) -> tuple[int, int, int | None]:
        """`(per_device_train_batch_size, steps_per_generation, pair_steps_per_generation)`: a generation batch is
        `rollout_buffer_size` items of K candidates; its pairs are split into optimizer steps of `train_batch_size`
        pairs on average. When those steps do not divide the batch's completions (every pair of 80 candidates: 3160
        steps per item), the completions make one TRL step and the pairs are split by `pair_steps_per_generation`."""
        items, per_step = self.rollout_buffer_size, self.comlrl_train_batch_size or self.rollout_buffer_size
        steps = math.ceil(items * self.pairs_per_prompt / per_step)
        rows = items * self.num_generations
        return (rows // steps, steps, None) if rows % steps == 0 else (rows, 1, steps)

    def _check_comlrl_fields(self) -> None:
        """CoMLRL 1.4.3's own checks of `MADPOConfig` (those of fields the core names otherwise; the core checks the
        rest), raised before anything is mapped."""
        check_fields(self, "MADPOConfig")
        check_parallel(self, "agent_devices")
        if self.reference_kl_enabled:
            raise ValueError(
                "`reference_kl_enabled=True` has no effect on CoMLRL's MADPO loss (it loads reference models and "
                "never uses them): leave it False. For a frozen reference in the DPO log-ratios set "
                "`reference_free=False`."
            )
        if self.num_turns != 1:
            raise ValueError(f"MADPO supports `num_turns=1` only (as CoMLRL 1.4.3), got {self.num_turns}.")
        defaults = {f.name: f.default for f in dataclasses.fields(MADPOConfig)}
        changed = {name: getattr(self, name) for name in UNUSED_FIELDS if getattr(self, name) != defaults[name]}
        if changed:
            logger.warning(
                "MADPOConfig: %s have no effect on MADPO, as in CoMLRL 1.4.3 (single turn, no advantages; logging "
                "counts optimizer steps).",
                ", ".join(f"`{name}={value!r}`" for name, value in changed.items()),
            )


class MADPOTrainer(MAGRPOTrainer, MultiAgentDPOTrainer):
    """Multi-agent DPO with CoMLRL 1.4.3's `MADPOTrainer` arguments, in its order: `MAGRPOTrainer`'s, plus
    `centralized_comparator_adapter` (default `TaggedCentralizedComparatorAdapter()`, checked in either mode, used
    with `collaboration_mode="centralized"`: one model, `num_agents` roles); `docs/comlrl-users.md` (MADPO)."""

    default_config_cls = config_family = MADPOConfig
    algorithm_name = "MADPO"
    _tag_names = DPO_TAG_NAMES  # TRL's class attribute, the native trainer's (MAGRPOTrainer's comes first otherwise)
    _name = "MADPO"

    def __init__(self, *args, centralized_comparator_adapter: Any = None, **kwargs):
        self.centralized_comparator_adapter = comparator_adapter(centralized_comparator_adapter)
        super().__init__(*args, **kwargs)

    __init__.__signature__ = with_keywords(MAGRPOTrainer.__init__, "centralized_comparator_adapter")
    get_decay_parameter_names = decay_every_parameter  # CoMLRL's AdamW decays every parameter


__all__ = ["MADPOConfig", "MADPOTrainer"]
