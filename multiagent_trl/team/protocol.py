"""`TeamTrainer`: what the helpers, the hub, the families and the CoMLRL layer read and call on a team trainer
(`MultiAgentGRPOTrainer` or a subclass). Typed here, below the trainers, so that helpers need not import one."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TeamTrainer(Protocol):
    """The public seams of the team core (each documented on `MultiAgentGRPOTrainer`):

    - `sample(rows, num_generations)`: one turn of joint candidates outside a training step;
    - `metrics_aside()`: a block whose records stay out of the training logs; `add_metrics`: values for the next;
    - `weights_changed()`: the agents' weights changed outside an optimizer step (vLLM engines take them);
    - `first_train_row`: the first row trained on (a model card's example);
    - `model_tags`: the tags of every agent's model card;
    - `agent_metric_prefix(i)` / `loss_name(kind, i)`: how agent i's metrics and losses are named;
    - `shared_folders()`, `checkpoint_model_folders()`, `checkpoint_files(folder)`, `check_checkpoint(folder)`:
      what a save and a checkpoint hold beside the agents, and the check before a resume.
    """

    args: Any
    accelerator: Any
    model: Any
    num_agents: int
    train_dataset: Any

    @property
    def first_train_row(self) -> dict | None: ...

    @property
    def model_tags(self) -> list[str]: ...

    def sample(self, rows: list[dict], num_generations: int) -> Any: ...

    def metrics_aside(self) -> AbstractContextManager[dict[str, dict[str, list]]]: ...

    def add_metrics(self, metrics: dict[str, list[float]], mode: str = "train") -> None: ...

    def weights_changed(self) -> None: ...

    def agent_metric_prefix(self, index: int) -> str: ...

    def loss_name(self, kind: str, index: int) -> str: ...

    def shared_folders(self) -> dict[str, str]: ...

    def checkpoint_model_folders(self) -> list[str]: ...

    def checkpoint_files(self, folder: str) -> list[str]: ...

    def check_checkpoint(self, folder: str) -> None: ...
