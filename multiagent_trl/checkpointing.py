"""Atomic checkpoints: a `checkpoint-N/` folder exists only once it is complete.

`Trainer._save_checkpoint` writes `checkpoint-N/` in place, file after file, so a process killed during a save leaves
a partial folder that `get_last_checkpoint` (what `train(resume_from_checkpoint=True)` uses) picks, and resuming from
it fails. `save_atomically` has Trainer write the checkpoint to `tmp-checkpoint-N/checkpoint-N/` instead; the main
process then renames it to `checkpoint-N/`. Names starting with `tmp-` match neither `get_last_checkpoint` nor the
rotation of `save_total_limit` (both look for `checkpoint-*`), so an unfinished save is never resumed from, counted or
rotated; the next save removes it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

STAGING_PREFIX = "tmp-"


def save_atomically(trainer, save_checkpoint: Callable, model, trial) -> None:
    """Run Trainer's `save_checkpoint(model, trial)` into a staging folder, then publish it as `checkpoint-N/`."""
    args, accelerator, state = trainer.args, trainer.accelerator, trainer.state
    run_dir = trainer._get_output_dir(trial=trial)
    name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
    final, staging = os.path.join(run_dir, name), os.path.join(run_dir, STAGING_PREFIX + name)
    staged = os.path.join(staging, name)
    if args.should_save:  # saves run one at a time: a staging folder left here is from a process that died mid-save
        for stale in Path(run_dir).glob(f"{STAGING_PREFIX}{PREFIX_CHECKPOINT_DIR}-*"):
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()

    # Trainer and TRL write to `<run dir>/checkpoint-N/`: the staging folder stands in for the run dir. Pushing to the
    # Hub waits until the checkpoint is published (the upload runs in the background and reads the folder).
    trainer._get_output_dir = lambda trial=None: staging
    trainer._push_from_checkpoint = lambda folder: None
    try:
        save_checkpoint(model, trial)
    finally:
        del trainer._get_output_dir, trainer._push_from_checkpoint
    if state.best_model_checkpoint == staged:  # Trainer found the best checkpoint (this one) under its staging name
        state.best_model_checkpoint = final
        if args.should_save:
            state.save_to_json(os.path.join(staged, TRAINER_STATE_NAME))
    accelerator.wait_for_everyone()  # every process has written its part (RNG states are per process)

    if args.should_save:
        publish(staged, final)
        rotate_checkpoints(run_dir, args.save_total_limit, state.best_model_checkpoint, use_mtime=True)
    accelerator.wait_for_everyone()
    if args.push_to_hub:
        trainer._push_from_checkpoint(final)


def publish(staged: str, final: str) -> None:
    """Rename the complete folder `staged` to `final`. At every moment `final` is absent or complete: a folder already
    there (a run resumed from an earlier checkpoint) is first moved aside into the staging folder, not deleted in
    place."""
    staging = os.path.dirname(staged)
    if os.path.isdir(final):
        os.rename(final, os.path.join(staging, "replaced"))
    os.rename(staged, final)
    shutil.rmtree(staging, ignore_errors=True)
