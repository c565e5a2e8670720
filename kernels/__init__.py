"""Numeric kernels, each with a plain-torch reference beside its fast path (see the issues)."""

__all__: list[str] = []
