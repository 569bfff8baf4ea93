"""vLLM servers for teams (`vllm_mode="server"`), on vLLM's CPU build: three servers of the `tiny-vllm` model started
as the docs say, then the same checks as the colocated engines' (`tests/test_vllm.py`) through them, and the errors
that name what a server lacks. Skips without vLLM, fails instead in CI (`MULTIAGENT_TRL_REQUIRE_VLLM=1`)."""

import os
import subprocess
import time

import pytest
import requests
from datasets import Dataset
from peft import LoraConfig

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.testing import tiny_model_path

from .conftest import free_port
from .test_vllm import (  # noqa: F401 (bare_vllm_environment, release_engines: autouse fixtures)
    PROMPTS,
    TEAMS,
    bare_vllm_environment,
    check_trains_and_syncs,
    length_ratio,
    release_engines,
    run_two_processes,
    vllm_args,
)


@pytest.fixture(scope="module")
def servers(vllm_available, tmp_path_factory):
    """Three vLLM servers of the `tiny-vllm` model, started as the docs say (`vllm_server.serve_command`, with
    `SERVER_ENV`): the first with LoRA for two adapters (a LoRA team's), the others without (one per agent of a team
    of separate models, whose syncs replace their weights). Their base URLs."""
    from multiagent_trl.vllm.server import SERVER_ENV, serve_command

    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # the server's own engine
    # A 1 GiB KV cache each, as the docs' command sets it: unset, each server takes most of the machine's memory.
    env.update(SERVER_ENV, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    logs = tmp_path_factory.mktemp("servers")
    processes, urls = [], []
    for k, adapters in enumerate((2, 0, 0)):
        port = free_port()
        command = serve_command(
            tiny_model_path("tiny-vllm"), port, adapters, 8, extra=["--max-model-len", "512", "--dtype", "float32"]
        )
        log = open(logs / f"server{k}.log", "w")
        processes.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for k, ((process, _), url) in enumerate(zip(processes, urls)):
            deadline = time.time() + 300
            while True:
                try:
                    if requests.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if process.poll() is not None or time.time() > deadline:
                    tail = (logs / f"server{k}.log").read_text()[-3000:]
                    pytest.fail(f"vLLM server {k} did not start: {tail}")
                time.sleep(2)
        yield urls
    finally:
        for process, log in processes:
            process.terminate()
            process.wait(timeout=60)
            log.close()


def team_urls(servers: list[str], kind: str) -> list[str]:
    """The LoRA team's one server, or one server per agent of a team of separate models."""
    return servers[:1] if kind == "lora" else servers[1:]


@pytest.mark.parametrize("kind", sorted(TEAMS))
def test_vllm_servers_generate_train_and_sync(servers, tmp_path, kind):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=vllm_args(tmp_path, vllm_mode="server", vllm_server_base_url=team_urls(servers, kind)),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
        **TEAMS[kind],
    )
    assert len({client.base_url for client in trainer._vllm.clients}) == (1 if kind == "lora" else 2)
    check_trains_and_syncs(trainer, kind)


@pytest.mark.parametrize("kind", sorted(TEAMS))
def test_vllm_servers_two_processes(servers, tmp_path, kind):
    """Both processes send their rows to the same servers, which the main process syncs while the other waits."""
    run_two_processes(tmp_path, kind, team_urls(servers, kind))


def test_server_urls_one_per_agent_or_one_for_a_lora_team(vllm_available, tmp_path):
    from multiagent_trl.vllm.server import server_urls

    one = vllm_args(tmp_path, vllm_mode="server", vllm_server_base_url=["http://a:1/"])
    assert one.vllm_server_base_url == "http://a:1/" and server_urls(one, 1) == ["http://a:1"]
    ports = vllm_args(tmp_path, vllm_mode="server", vllm_server_host="h", vllm_server_port=[8001, 8002])
    assert server_urls(ports, 2) == ["http://h:8001", "http://h:8002"]
    with pytest.raises(ValueError, match=r"one server per agent \(2\), but `vllm_server_base_url` gives 1"):
        MultiAgentGRPOTrainer(
            model=tiny_model_path("tiny-vllm"),
            reward_funcs=length_ratio,
            args=one,
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        )
    with pytest.raises(ValueError, match="names one server for several agents"):
        server_urls(vllm_args(tmp_path, vllm_mode="server", vllm_server_port=[8001, 8001]), 2)
    with pytest.raises(ValueError, match="vllm_mode"):
        vllm_args(tmp_path, vllm_mode="remote")


def test_an_unreachable_server_says_how_to_start_it(vllm_available, tmp_path):
    with pytest.raises(ConnectionError, match=r"Start the LoRA team's server first: .*--enable-lora --max-loras 2"):
        MultiAgentGRPOTrainer(
            model=tiny_model_path("tiny-vllm"),
            reward_funcs=length_ratio,
            args=vllm_args(
                tmp_path, vllm_mode="server", vllm_server_base_url=f"http://127.0.0.1:{free_port()}",
                vllm_server_timeout=1,
            ),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            **TEAMS["lora"],
        )  # fmt: skip


@pytest.mark.parametrize(
    "server, rank, message",
    [(1, 8, "serves no LoRA adapters"), (0, 16, "up to rank 8 .* below the team's rank 16")],
    ids=["no-lora", "rank"],
)
def test_a_server_that_cannot_serve_the_lora_team_is_refused(servers, tmp_path, server, rank, message):
    with pytest.raises(ValueError, match=message):
        MultiAgentGRPOTrainer(
            model=tiny_model_path("tiny-vllm"),
            reward_funcs=length_ratio,
            args=vllm_args(tmp_path, vllm_mode="server", vllm_server_base_url=servers[server]),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            peft_config=LoraConfig(r=rank, target_modules=["q_proj", "v_proj"]),
        )
