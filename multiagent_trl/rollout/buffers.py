"""Generation batches ("buffers") that cover every item of the dataset each epoch.

TRL's `RepeatSampler` cuts each epoch's permutation into chunks of one generation batch's prompts and drops the last
chunk when it is short: with 10 items and generation batches of 8, 2 items are never trained on in that epoch, and
a dataset smaller than one generation batch yields no batch at all (Trainer then stops with "args.max_steps must be
set to a positive value"). CoMLRL's buffer-filling trainers train their last, smaller buffer instead.

`CoveringRepeatSampler` keeps the last chunk and completes it with items wrapped from the start of the same epoch's
permutation (as torch's `DistributedSampler` pads without `drop_last`): every generation batch keeps its size, which
TRL's step machinery needs, and every item is trained each epoch (the wrapped ones twice). Its length counts the
last chunk, so Trainer's steps per epoch (`max_steps`, `num_train_epochs`) agree with what it yields.
"""

from __future__ import annotations

import math

import torch
from trl.trainer.utils import RepeatSampler


class CoveringRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler`, with the same arguments, order and seeding, except that the last chunk of each epoch
    is completed with the epoch's first indices instead of dropped (see the module docstring).

    >>> sampler = CoveringRepeatSampler(["a", "b", "c", "d", "e"], mini_repeat_count=1, batch_size=2, shuffle=False)
    >>> list(sampler), len(sampler)
    ([0, 1, 2, 3, 4, 0], 6)
    """

    def _epoch_order(self) -> list[int]:
        if self.shuffle:
            return torch.randperm(self.num_samples, generator=self.generator).tolist()
        return list(range(self.num_samples))

    def __iter__(self):
        indexes = self._epoch_order()
        if not indexes:
            return
        padding = -len(indexes) % self.batch_size
        indexes += (indexes * math.ceil(padding / len(indexes)))[:padding]  # wraps more than once past a small set
        for start in range(0, len(indexes), self.batch_size):
            chunk = indexes[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        chunks = math.ceil(self.num_samples / self.batch_size)
        return chunks * self.batch_size * self.mini_repeat_count * self.repeat_count


def covering(sampler: RepeatSampler) -> CoveringRepeatSampler:
    """The `CoveringRepeatSampler` with `sampler`'s data, repeats, chunk size, shuffling and seed (a fresh generator
    seeded as `sampler`'s was, so the permutations are the ones `sampler` would have drawn)."""
    return CoveringRepeatSampler(
        sampler.data_source,
        mini_repeat_count=sampler.mini_repeat_count,
        batch_size=sampler.batch_size,
        repeat_count=sampler.repeat_count,
        shuffle=sampler.shuffle,
        seed=sampler.seed,
    )


def check_fills_a_batch(rows: int, batch: int) -> None:
    """Raise a `ValueError` when a training set of `rows` rows makes no batch of `batch` prompts (a sampler's length
    of 0, or an empty set): Trainer would log a warning and return after no step, or fail on `max_steps`."""
    if rows == 0:
        raise ValueError("`train_dataset` is empty: training would take no step. Pass a dataset with rows.")
    if rows < batch:
        raise ValueError(
            f"`train_dataset` has {rows} rows, fewer than one generation batch's {batch} prompts "
            "(`generation_batch_size / num_generations`, every process's together): training would take no step. "
            "Add rows, or lower `per_device_train_batch_size` or `steps_per_generation`."
        )
