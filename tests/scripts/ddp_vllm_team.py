"""Trains a 2-agent team with vLLM under `accelerate launch --num_processes 2` (one engine set per process) and writes
what `tests/test_vllm.py` checks: per rank, the steps, the world size, and each agent's largest difference between
vLLM's log-probs and the model's at every step (TRL's importance-sampling metric: near 0 only if each process's engine
holds the weights of the last step)."""

import json
import sys

# Neither `VLLM_ENABLE_V1_MULTIPROCESSING` nor `VLLM_CPU_KVCACHE_SPACE` is set here or by the test that launches
# this: each rank's engines must start as they do from a bare shell.
from datasets import Dataset
from peft import LoraConfig

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.testing import end_launched_process, tiny_model_path


def length_ratio(completions1, completions2):
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def main(out_dir: str, kind: str, urls: list[str]) -> None:
    """`kind`: "lora" (one engine with both adapters per process) or "separate" (two engines per process); with
    `urls`, the team's vLLM servers instead (`vllm_mode="server"`)."""
    server = dict(vllm_mode="server", vllm_server_base_url=urls) if urls else {}
    args = MultiAgentGRPOConfig(
        output_dir=f"{out_dir}/run",
        use_vllm=True,
        **server,
        num_agents=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=5e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"Row {i}: tell a story." for i in range(8)]}),
        peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) if kind == "lora" else None,
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    differences = [[entry[f"agent_{i}/sampling/sampling_logp_difference/max"] for entry in logged] for i in range(2)]
    result = {"steps": trainer.state.global_step, "world": trainer.accelerator.num_processes, "diffs": differences}
    with open(f"{out_dir}/rank{trainer.accelerator.process_index}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    end_launched_process()
