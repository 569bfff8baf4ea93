"""One process of a simulated 2-node run (one process per "node", gloo on CPU), for tests/test_checkpoints.py.

Usage: `RANK=r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python two_nodes.py
OUT_DIR`. With `LOCAL_RANK=0` in both processes, each is its node's main process. For each storage layout
("shared": one output dir for both nodes; "local": `node{r}/` per node, as node-local disks) and each
`save_on_each_node`, a 2-agent team saves checkpoints at steps 1 and 2 (`save_total_limit=1`): step 1 through
`save_atomically` directly, step 2 through the trainer's `_save_checkpoint`. Writes `OUT_DIR/rank{r}.json` with the
layouts this process published at step 1.
"""

import functools
import json
import os
import sys

from datasets import Dataset
from trl import GRPOTrainer

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.team.checkpointing import save_atomically
from multiagent_trl.testing import end_launched_process, tiny_model_path


def save(trainer: MultiAgentGRPOTrainer, staging: str) -> None:
    """Trainer's own checkpoint save into `staging` (what the trainer's `_save_checkpoint` hands `save_atomically`)."""
    trainer._staging_dir = staging
    try:
        GRPOTrainer._save_checkpoint(trainer, trainer.model, None)
    finally:
        trainer._staging_dir = None


def main(out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    dataset = Dataset.from_dict({"prompt": ["Tell a story:", "Tell a joke:"]})
    published = {}
    for storage in ("shared", "local"):
        for each_node in (False, True):
            layout = f"{storage}-each_node={each_node}"
            run_dir = os.path.join(out_dir, layout, f"node{rank}" if storage == "local" else "")
            args = MultiAgentGRPOConfig(
                output_dir=run_dir,
                num_agents=2,
                per_device_train_batch_size=2,
                num_generations=2,
                max_completion_length=4,
                report_to="none",
                save_strategy="steps",
                save_steps=1,
                save_total_limit=1,
                save_on_each_node=each_node,
                disable_tqdm=True,
            )
            trainer = MultiAgentGRPOTrainer(
                model=tiny_model_path(), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                args=args, train_dataset=dataset,
            )  # fmt: skip
            trainer.create_optimizer_and_scheduler(num_training_steps=2)
            trainer.state.global_step = 1
            published[layout] = save_atomically(
                trainer.args.output_dir,
                trainer.args,
                trainer.accelerator,
                trainer.state,
                functools.partial(save, trainer),
            )
            trainer.state.global_step = 2
            trainer._save_checkpoint(trainer.model, None)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(published, f)


if __name__ == "__main__":
    main(sys.argv[1])
    end_launched_process()
