"""The background GRPO trainer: dataset, objective, loop, adapters and their promotion."""

__all__: list[str] = []
