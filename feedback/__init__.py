"""Keep/revert signals, rewards and the background trainer (built on the foundation; see the issues)."""

__all__: list[str] = []
