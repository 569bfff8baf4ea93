"""Snapshots of a run between training runs: `RunSnapshots`, a trainer mixin: `save_checkpoint(dir)` writes
Trainer's checkpoint format atomically, `load_checkpoint(dir)` loads the weights now and resumes the optimizer and
loop position at the next `train()` (`take_pending_checkpoint`), `checkpoint_every_epochs(k)` saves after every k-th
epoch (`CheckpointEveryEpochs`)."""

from __future__ import annotations

import os
import shutil
import tempfile

from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy

from .views import swapped


class RunSnapshots:
    """Mixin listed before a `transformers.Trainer` subclass among a trainer's bases."""

    pending_checkpoint: str | None = None  # set by `load_checkpoint`: the next `train()` resumes from it

    def save_checkpoint(self, output_dir: str) -> str:
        """CoMLRL's snapshot between training runs: the team (and critics), the optimizer and scheduler once training
        has built them, the RNG states and the trainer state, in Trainer's checkpoint format, written under another
        name and renamed when complete. `load_checkpoint(output_dir)` or `train(resume_from_checkpoint=output_dir)`
        continue from it. Refuses to replace a folder that is not a checkpoint, as CoMLRL does. Returns the folder."""
        target = os.path.abspath(os.path.expanduser(output_dir))
        if os.path.islink(target) or (
            os.path.exists(target) and not os.path.isfile(os.path.join(target, TRAINER_STATE_NAME))
        ):
            raise FileExistsError(f"Refusing to replace a folder that is not a checkpoint: {target}")
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-", dir=parent)
        try:
            # Trainer's own checkpoint (`checkpoint-N/` under the staging folder); weights only before training.
            with swapped(self.args, output_dir=staging, save_only_model=self.optimizer is None, save_total_limit=None):
                self._save_checkpoint(self.model, trial=None)
            written = os.path.join(staging, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            if os.path.exists(target):
                shutil.rmtree(target)
            os.replace(written, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def load_checkpoint(self, checkpoint: str) -> dict[str, float]:
        """Load what `save_checkpoint` (or a `checkpoint-N/` of `train`) wrote: the weights now, and the optimizer,
        scheduler and loop position when `train()` next runs (as `train(resume_from_checkpoint=checkpoint)`).
        Returns the saved progress, `{"global_step", "epoch"}`."""
        state_file = os.path.join(checkpoint, TRAINER_STATE_NAME)
        if not os.path.isfile(state_file):
            raise FileNotFoundError(f"{checkpoint} is not a checkpoint: it has no {TRAINER_STATE_NAME}.")
        self._load_from_checkpoint(checkpoint)
        self.pending_checkpoint = checkpoint
        state = TrainerState.load_from_json(state_file)
        return {"global_step": state.global_step, "epoch": state.epoch}

    def checkpoint_every_epochs(self, interval: int, output_dir: str | None = None, total_limit: int | None = None):
        """From now on a checkpoint after every `interval`-th epoch and after the last one (in place of
        `args.save_strategy`), in `output_dir` (default `args.output_dir`), at most `total_limit` kept."""
        if output_dir is not None:
            self.args.output_dir = output_dir
        self.args.save_strategy = SaveStrategy.NO  # the callback decides, per epoch
        self.args.save_total_limit = total_limit
        self.callback_handler.callbacks = [
            cb for cb in self.callback_handler.callbacks if not isinstance(cb, CheckpointEveryEpochs)
        ]
        self.add_callback(CheckpointEveryEpochs(interval))

    def take_pending_checkpoint(self, resume_from_checkpoint):
        """`resume_from_checkpoint`, or when `None` the checkpoint `load_checkpoint` asked for (then forgotten)."""
        if resume_from_checkpoint is None:
            resume_from_checkpoint, self.pending_checkpoint = self.pending_checkpoint, None
        return resume_from_checkpoint


class CheckpointEveryEpochs(TrainerCallback):
    """CoMLRL's `train(checkpoint_interval=k)`: a checkpoint after every k-th epoch and after the last one."""

    def __init__(self, interval: int):
        self.interval = interval

    def on_epoch_end(self, args, state, control, **kwargs):
        epoch = round(state.epoch or 0)
        if epoch % self.interval == 0 or state.global_step >= state.max_steps:
            control.should_save = True
        return control
