"""Atomic checkpoints: a `checkpoint-N/` folder exists only once it is complete, on every node's storage.

`Trainer._save_checkpoint` writes `checkpoint-N/` in place, file after file, so a process killed during a save leaves
a partial folder that `get_last_checkpoint` (what `train(resume_from_checkpoint=True)` uses) picks, and resuming from
it fails. `save_atomically` has Trainer write the checkpoint to `tmp-checkpoint-N-<id>/checkpoint-N/` instead and
renames it to `checkpoint-N/` once every process has written its part. Names starting with `tmp-` match neither
`get_last_checkpoint` nor the rotation of `save_total_limit` (both look for `checkpoint-*`), so an unfinished save is
never resumed from, counted or rotated; the next save removes it. `<id>` is new for every save (drawn by process 0
and broadcast), so a save never writes into a folder left by one that died.

Who renames, on multi-node runs. Every process writes into the checkpoint folder (Trainer saves one
`rng_state_<rank>.pth` per process), and the processes that Trainer lets write the model (`args.should_save`:
process 0, or each node's main process with `save_on_each_node=True`) are not one per storage:

- nodes on a shared filesystem with `save_on_each_node=True` would have two processes rename the same folder (the
  second one fails, or moves the first one's published checkpoint aside);
- nodes on node-local disks with `save_on_each_node=False` would leave the other nodes' RNG files in a staging folder
  that nobody renames or removes.

So the renaming is decided per storage, not per node: each node's main process (`local_process_index == 0`) writes a
marker file `.node-<rank>` into the staging folder; after an all-gather of those ranks, each node's main process looks
for the markers of all of them, and the one with the lowest rank among those it can see renames (`publishes`). That is
exactly one process per storage, whatever the filesystem layout and `save_on_each_node`, with nothing to configure:
a setting (shared storage or not) would be one more thing to get right per cluster, and a wrong one loses checkpoints,
while the markers see the layout the run actually has.
What ends up under a `checkpoint-N/` name is what Trainer would have written there in place: on a node-local disk of
a node that does not save the model, a folder with its processes' RNG states only. As in Trainer, old checkpoints are
rotated (`save_total_limit`) only by processes with `should_save`. Processes of one node are assumed to see the same
filesystem, as Trainer does.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list, gather_object
from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

logger = logging.getLogger(__name__)

STAGING_PREFIX = "tmp-"
MARKER_PREFIX = ".node-"


def publishes(process_index: int, local_main: bool, visible: Sequence[int]) -> bool:
    """Whether this process renames the staging folder: it is its node's main process and has the lowest rank among
    the node main processes whose markers it sees (those that share its storage, itself included).

    >>> publishes(0, True, [0, 8])  # node 0 on a storage shared with node 1 (ranks 8-15)
    True
    >>> publishes(8, True, [0, 8])  # node 1 on the same storage: node 0 renames
    False
    >>> publishes(8, True, [8])  # node 1 on its own disk
    True
    >>> publishes(9, False, [8])  # not a node's main process
    False
    """
    return local_main and process_index == min(visible)


def save_atomically(run_dir: str, args, accelerator, state, save_into: Callable[[str], None]) -> bool:
    """Have `save_into(staging)` write Trainer's `checkpoint-N/` with the folder `staging` standing in for `run_dir`,
    then publish it as `run_dir/checkpoint-N/` (N: `state.global_step`).

    `save_into` is Trainer's own checkpoint save with its output folder redirected (the team trainer points
    `_get_output_dir` at `staging` meanwhile). Must be called by every process, like `Trainer._save_checkpoint`.
    Returns whether this process renamed the folder (one process per storage, see the module docstring). Pushing to
    the Hub is the caller's, once the folder is published (the upload runs in the background and reads it).
    """
    name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
    save_id = broadcast_object_list([uuid.uuid4().hex[:8]])[0]  # one name on every process
    final, staging = os.path.join(run_dir, name), os.path.join(run_dir, f"{STAGING_PREFIX}{name}-{save_id}")
    staged = os.path.join(staging, name)
    publisher = _find_publisher(staging, accelerator, warn=args.save_on_each_node)

    save_into(staging)
    if state.best_model_checkpoint == staged:  # Trainer found the best checkpoint (this one) under its staging name
        state.best_model_checkpoint = final
        if args.should_save:
            state.save_to_json(os.path.join(staged, TRAINER_STATE_NAME))
    accelerator.wait_for_everyone()  # every process has written its part (RNG states are per process)

    if publisher:
        if os.path.isdir(staged):  # nothing is staged on a storage where no process wrote (`save_only_model`)
            publish(staged, final)
        shutil.rmtree(staging, ignore_errors=True)
        for stale in Path(run_dir).glob(f"{STAGING_PREFIX}{PREFIX_CHECKPOINT_DIR}-*"):  # from saves that died
            shutil.rmtree(stale, ignore_errors=True)
        if args.should_save:
            rotate_checkpoints(run_dir, args.save_total_limit, state.best_model_checkpoint, use_mtime=True)
    accelerator.wait_for_everyone()
    return publisher


def _find_publisher(staging: str, accelerator, warn: bool) -> bool:
    """Whether this process publishes `staging`: node main processes leave a marker there, then each looks for the
    others' (see `publishes`). With `warn`, process 0 warns when it shares its storage with another node."""
    rank, local_main = accelerator.process_index, accelerator.local_process_index == 0
    if local_main:
        os.makedirs(staging, exist_ok=True)
        Path(staging, f"{MARKER_PREFIX}{rank}").touch()
    # The all-gather returns only once every node's main process has contributed, so after its marker is written.
    node_mains = [r for r in gather_object([rank if local_main else None]) if r is not None]
    if not local_main:
        return False
    visible = [r for r in node_mains if os.path.exists(os.path.join(staging, f"{MARKER_PREFIX}{r}"))]
    if warn and rank == 0 and len(visible) > 1:
        logger.warning(
            "save_on_each_node=True, but %d nodes share the output storage (%s): each writes the same checkpoint "
            "files, and one of them publishes the checkpoint. On a shared filesystem set save_on_each_node=False.",
            len(visible),
            os.path.dirname(staging),
        )
    return publishes(rank, local_main, visible)


def publish(staged: str, final: str) -> None:
    """Rename the complete folder `staged` to `final`. At every moment `final` is absent or complete: a folder already
    there (a run resumed from an earlier checkpoint) is first moved aside into the staging folder, not deleted in
    place."""
    staging = os.path.dirname(staged)
    if os.path.isdir(final):
        os.rename(final, os.path.join(staging, "replaced"))
    os.rename(staged, final)


def save_team(team, processing_classes: Sequence, output_dir: str, state_dict: dict | None, args) -> None:
    """Save each agent of `team` to `output_dir/agent_{i}/` with its tokenizer: a model folder for `from_pretrained`,
    or an adapter folder for `PeftModel.from_pretrained` (plus `merged/` with `args.save_merged_models`), and `args`
    as Trainer saves them."""
    for i, processing_class in enumerate(processing_classes):
        agent_dir = os.path.join(output_dir, f"agent_{i}")
        team.save_agent(i, agent_dir, state_dict=state_dict, merged=args.save_merged_models)
        processing_class.save_pretrained(agent_dir)
    torch.save(args, os.path.join(output_dir, TRAINING_ARGS_NAME))


def load_team_folders(team, folder: str, num_agents: int) -> None:
    """Load each agent of `team` from `folder/agent_{i}/` (what `save_team` wrote)."""
    for i in range(num_agents):
        agent_dir = os.path.join(folder, f"agent_{i}")
        if not os.path.isdir(agent_dir):
            raise FileNotFoundError(
                f"Checkpoint {folder} has no folder agent_{i}/; it was not written by a MultiAgentGRPOTrainer with "
                f"{num_agents} agents."
            )
        team.load_agent(i, agent_dir)
