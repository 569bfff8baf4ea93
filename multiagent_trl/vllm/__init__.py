"""vLLM generation for teams: one engine (or server) for a LoRA team, one per separate model."""
