"""Saved folders checked whole before anything is loaded from them.

A checkpoint is loaded file after file (each agent, each critic, the reward model, then at the next `train()` the
optimizer, scheduler and RNG states), and the libraries that read them fail on a damaged file with their own error,
which rarely names the file: a truncated `agent_1/model.safetensors` fails after agent 0 is already overwritten, a
missing `config.json` has transformers build a model of another shape, and a truncated `optimizer.pt` fails only
once training has started. So the loaders check every file first (`check_checkpoint`, `check_folder`), and load only
a folder that passed, so that a refused folder changes nothing.

What "readable" means, by file kind (`check_saved_file`), each check reading little more than the file's index:

- `.json`: parses.
- `.safetensors`: its header parses and covers the whole file (safetensors refuses a truncated file on opening).
- `.pt`, `.pth`, `.bin` (`torch.save`'s zip archives): the archive's index, at its end, is there and every entry
  lies within the file, which a truncated file fails.

Other files (tokenizer vocabularies, README, markers) are only required where a caller names them.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterable, Sequence

from safetensors import safe_open

TRAINER_STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
CHECKED_SUFFIXES = (".json", ".safetensors", ".pt", ".pth", ".bin")


class DamagedFileError(ValueError):
    """A saved file is there but cannot be read (truncated, or not what its name says). The message names it."""


def check_saved_file(path: str) -> None:
    """Raise `FileNotFoundError` if `path` is missing, `DamagedFileError` if it cannot be read as its kind (see the
    module docstring); both name the file. Files of other kinds only need to exist."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing.")
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                json.load(f)
        elif path.endswith(".safetensors"):
            with safe_open(path, framework="pt"):
                pass
        elif path.endswith((".pt", ".pth", ".bin")):
            _check_zip(path)
    except Exception as error:  # every reader's own error (safetensors' has no common base with the others)
        raise DamagedFileError(
            f"{path} cannot be read ({type(error).__name__}: {error}): it is truncated or damaged."
        ) from error


def _check_zip(path: str) -> None:
    """`torch.save`'s archive: its index is readable and every entry lies within the file."""
    size = os.path.getsize(path)
    with zipfile.ZipFile(path) as archive:
        for entry in archive.infolist():
            if entry.header_offset + entry.compress_size > size:
                raise ValueError(f"entry {entry.filename} runs past the end of the file")


def saved_files(folder: str) -> list[str]:
    """Every file under `folder` (recursively) of a kind `check_saved_file` reads, sorted."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # staging folders of unfinished saves
        found += [os.path.join(root, name) for name in sorted(files) if name.endswith(CHECKED_SUFFIXES)]
    return found


def check_folder(folder: str, required: Iterable[str] = ()) -> None:
    """Check that `folder` holds every path in `required` (relative to it) and that every file in it that
    `check_saved_file` reads is readable. Raises `FileNotFoundError` or `DamagedFileError`, naming the file."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder} is not a folder.")
    for name in required:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{folder} is incomplete: it has no {name}.")
    for path in saved_files(folder):
        check_saved_file(path)


def model_files(folder: str) -> list[str]:
    """The files (relative to `folder`) a saved model folder needs for its weights: `config.json` and
    `model.safetensors` (or every shard its index lists, or `pytorch_model.bin`), or for a PEFT adapter
    `adapter_config.json` and its weights. Raises `FileNotFoundError` when `folder` holds no weights at all."""
    if os.path.isfile(os.path.join(folder, "adapter_config.json")):
        for weights in ("adapter_model.safetensors", "adapter_model.bin"):
            if os.path.isfile(os.path.join(folder, weights)):
                return ["adapter_config.json", weights]
        raise FileNotFoundError(f"{folder} is incomplete: it has no adapter_model.safetensors.")
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index_path = os.path.join(folder, index)
        if os.path.isfile(index_path):
            check_saved_file(index_path)
            with open(index_path, encoding="utf-8") as f:
                shards = sorted(set(json.load(f).get("weight_map", {}).values()))
            return ["config.json", index, *shards]
    for weights in ("model.safetensors", "pytorch_model.bin"):
        if os.path.isfile(os.path.join(folder, weights)):
            return ["config.json", weights]
    raise FileNotFoundError(f"{folder} is incomplete: it has no model.safetensors (nor another weights file).")


def rng_file(process_index: int = 0, world_size: int = 1) -> str:
    """The RNG state file Trainer saves for one process."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth"


def training_state_files(folder: str, process_index: int = 0, world_size: int = 1) -> list[str]:
    """The training state files `folder` must hold: Trainer writes the optimizer, the scheduler and the RNG states
    together (none with `save_only_model`), and skips loading all of them when one is missing, so any one of them
    there requires the others."""
    names = [OPTIMIZER_FILE, SCHEDULER_FILE, rng_file(process_index, world_size)]
    return names if any(os.path.exists(os.path.join(folder, n)) for n in names) else []


def check_checkpoint(
    folder: str,
    model_folders: Sequence[str] = (),
    required: Iterable[str] = (),
    process_index: int = 0,
    world_size: int = 1,
    engine_state: bool = False,
) -> None:
    """Check a trainer checkpoint whole before loading any of it (see the module docstring).

    Args:
        folder: The checkpoint (`checkpoint-N/`, or what `save_checkpoint` wrote).
        model_folders: Its model folders (relative: `agent_0`, `critic`, ...), each needing its weights
            (`model_files`).
        required: More files it must hold (relative), beside `trainer_state.json`.
        process_index, world_size: Which RNG state file this process reads.
        engine_state: The optimizer is an engine's (FSDP, DeepSpeed), saved in its own layout: Trainer's
            optimizer/scheduler/RNG set is then not required.

    Raises:
        FileNotFoundError: a file is missing (named in the message).
        DamagedFileError: a file cannot be read (named in the message).
    """
    names = [TRAINER_STATE_FILE, *required]
    if not engine_state:
        names += training_state_files(folder, process_index, world_size)
    for sub in model_folders:
        path = os.path.join(folder, sub)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{folder} is incomplete: it has no folder {sub}/.")
        names += [os.path.join(sub, name) for name in model_files(path)]
    check_folder(folder, names)


__all__ = [
    "DamagedFileError",
    "check_checkpoint",
    "check_folder",
    "check_saved_file",
    "model_files",
    "rng_file",
    "saved_files",
    "training_state_files",
]
