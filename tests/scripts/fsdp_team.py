"""Trains 2-agent tiny teams under FSDP2 and then DDP, in the same 2 processes, and writes what the tests check.

    ACCELERATE_USE_CPU=true accelerate launch --config_file examples/accelerate_configs/fsdp.yaml \\
        --num_processes 2 --mixed_precision no tests/scripts/fsdp_team.py OUT train

For each engine ("fsdp", "ddp") and kind of team ("full": two separate models; "lora": two adapters on one base), each
rank writes `{engine}-{kind}-rank{r}.json`: the engine it ran under, its parameter bytes per agent (the local shards
under FSDP) against the full sizes, the FSDP units per agent, and a fingerprint of the gathered weights. The main
process also writes the gathered weights (`{engine}-{kind}-weights.pt`) and the final model
(`{engine}-{kind}-final/agent_{i}/`, through `save_model`). Under FSDP, the full team also trains a second time,
resumed from its step-2 checkpoint (`fsdp-full-resumed-weights.pt`).
"""

import json
import os
import sys

import torch
from datasets import Dataset
from peft import LoraConfig

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.preference.iterative import MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer
from multiagent_trl.team.sharding import full_state_dict, local_parameter_bytes, parameter_bytes
from multiagent_trl.testing import end_launched_process, tiny_model_path


def ratio(completions1, completions2):
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def make_trainer(out_dir: str, kind: str, run: str, **overrides) -> MultiAgentGRPOTrainer:
    settings = dict(
        output_dir=f"{out_dir}/{run}",
        num_agents=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    if kind == "full":
        # Sharded separate models generate one agent at a time (batching them would gather every agent at once);
        # the DDP run does too, so that both engines sample the same tokens.
        settings["generation_mode"] = "per_agent"
    args = MultiAgentGRPOConfig(**{**settings, **overrides})
    dataset = Dataset.from_dict({"prompt": [f"Row {i}: tell a story." for i in range(8)]})
    return MultiAgentGRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=ratio,
        args=args,
        train_dataset=dataset,
        formatters=[lambda row: "A " + row["prompt"], lambda row: "B " + row["prompt"]],
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if kind == "lora" else None,
    )


def agent_modules(team) -> list[torch.nn.Module]:
    return list(team.agents) if hasattr(team, "agents") else [team.peft_model]


def train(out_dir: str, engine: str, kind: str) -> None:
    """Train one team, write this rank's report (and, on the main process, the gathered weights and the model)."""
    from torch.distributed.fsdp import FSDPModule

    checkpointing = engine == "fsdp" and kind == "full"
    saving = dict(save_strategy="steps", save_steps=2) if checkpointing else {}
    run = f"{engine}-{kind}"
    trainer = make_trainer(out_dir, kind, run, **saving)
    if kind == "lora":
        # A pass without gradients before training (an evaluation's, a look at the agents) leaves PEFT's last
        # `set_adapter` in force: agent_1's adapter alone requires gradients. Every adapter must train all the same.
        with torch.no_grad():
            trainer.model.peft_model.set_adapter("agent_1")
    trainer.train()
    team, accelerator = trainer.model, trainer.accelerator
    state = full_state_dict(team)  # on every rank, gathered
    modules = agent_modules(team)
    report = {
        "engine": accelerator.state.distributed_type.value,
        "world": accelerator.num_processes,
        "local_bytes": [local_parameter_bytes(m) for m in modules],
        "full_bytes": [parameter_bytes(m) for m in modules],
        "units": [sum(isinstance(m, FSDPModule) for m in module.modules()) for module in modules],
        "fingerprint": {k: float(v.double().sum()) for k, v in state.items()},
    }
    trainer.save_model(f"{out_dir}/{run}-final")
    with open(f"{out_dir}/{run}-rank{accelerator.process_index}.json", "w") as f:
        json.dump(report, f)
    if accelerator.is_main_process:
        torch.save(state, f"{out_dir}/{run}-weights.pt")
    if checkpointing:  # the same run again, resumed from its step-2 checkpoint
        resumed = make_trainer(out_dir, kind, run, **saving)
        resumed.train(resume_from_checkpoint=f"{out_dir}/{run}/checkpoint-2")
        resumed_state = full_state_dict(resumed.model)
        if accelerator.is_main_process:
            torch.save(resumed_state, f"{out_dir}/{run}-resumed-weights.pt")
    accelerator.wait_for_everyone()


def main(out_dir: str, mode: str) -> None:
    """`mode`: "train" (under the FSDP launch config: FSDP2 runs, then the same runs as DDP in the same processes),
    "construct" (only build a trainer: under a launch that is not one distributed run, this must raise) or
    "comparator" (build iterative DPO with the history comparator, which FSDP must refuse)."""
    if mode == "construct":
        make_trainer(out_dir, "full", "construct")
        return
    if mode == "comparator":
        args = MultiAgentIterativeDPOConfig(
            output_dir=f"{out_dir}/comparator", num_agents=2, per_device_train_batch_size=4, num_generations=4,
            max_completion_length=8, report_to="none", comparator="history",
        )  # fmt: skip
        dataset = Dataset.from_dict({"prompt": ["Row 0: tell a story."]})
        MultiAgentIterativeDPOTrainer(model=tiny_model_path(), reward_funcs=ratio, args=args, train_dataset=dataset)
        return
    for kind in ("full", "lora"):
        train(out_dir, "fsdp", kind)
    # Without ACCELERATE_USE_FSDP, the next TrainingArguments set up plain data parallelism (DDP over gloo).
    os.environ["ACCELERATE_USE_FSDP"] = "false"
    for kind in ("full", "lora"):
        train(out_dir, "ddp", kind)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_launched_process()
