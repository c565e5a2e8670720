"""Versioned LoRA adapters, the promoted-adapter pointer, and rollback.

Layout under the registry root (`<cache>/adapters` by default):

    versions/v0003/            one trained adapter (peft files) + meta.json (metrics, parent, time)
    promoted.json              {"current": "v0003" | null, "history": ["v0001", "v0003"], "updated_at"}

The language server watches `promoted.json` (see `context.adapters` and the server's adapter
feature) and applies the adapter it names. Every write is atomic (a temporary file, then
`os.replace`), so a reader never sees half a pointer or half an adapter.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context.errors import AdapterError

__all__ = ["AdapterRef", "AdapterRegistry", "POINTER_NAME", "read_pointer", "sync_runtime_adapter"]

POINTER_NAME = "promoted.json"


@dataclass(frozen=True)
class AdapterRef:
    """One stored adapter version."""

    id: str
    path: Path
    meta: dict[str, Any]


def _atomic_write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def read_pointer(root: Path) -> dict[str, Any]:
    """The promoted-adapter pointer; an absent or unreadable one means the base model."""
    try:
        pointer = json.loads((Path(root) / POINTER_NAME).read_text())
    except (OSError, ValueError):
        return {"current": None, "history": []}
    if not isinstance(pointer, dict) or not isinstance(pointer.get("history", []), list):
        return {"current": None, "history": []}
    return pointer


class AdapterRegistry:
    """Stores adapter versions and says which one is promoted."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.versions_dir = self.root / "versions"

    def add_version(self, save: Callable[[Path], None], meta: dict[str, Any]) -> AdapterRef:
        """Store a new version: `save(directory)` writes the adapter files (peft save_pretrained)."""
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        number = 1 + max((int(p.name[1:]) for p in self.versions_dir.glob("v[0-9]*") if p.name[1:].isdigit()),
                         default=0)
        version = f"v{number:04d}"
        tmp = self.versions_dir / f".{version}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            save(tmp)
            full_meta = {"id": version, "created_at": time.time(), "parent": self.current_id(), **meta}
            (tmp / "meta.json").write_text(json.dumps(full_meta, indent=1))
            os.replace(tmp, self.versions_dir / version)
        except OSError as exc:
            raise AdapterError(f"cannot store adapter {version} in {self.versions_dir}: {exc}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self.get(version)

    def get(self, version: str) -> AdapterRef:
        path = self.versions_dir / version
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise AdapterError(f"adapter {version} is not in {self.versions_dir}") from exc
        return AdapterRef(version, path, meta)

    def versions(self) -> list[AdapterRef]:
        found = sorted(p.name for p in self.versions_dir.glob("v[0-9]*") if (p / "meta.json").is_file())
        return [self.get(v) for v in found]

    def current_id(self) -> str | None:
        return read_pointer(self.root).get("current")

    def current(self) -> AdapterRef | None:
        version = self.current_id()
        return self.get(version) if version else None

    def promote(self, version: str) -> AdapterRef:
        """Make `version` the adapter the server uses."""
        ref = self.get(version)
        pointer = read_pointer(self.root)
        history = [v for v in pointer.get("history", []) if v != version] + [version]
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic_write_json(self.root / POINTER_NAME,
                           {"current": version, "history": history, "updated_at": time.time()})
        return ref

    def rollback(self) -> str | None:
        """Go back to the previously promoted adapter (None: the base model); returns it."""
        pointer = read_pointer(self.root)
        history = list(pointer.get("history", []))
        if pointer.get("current") is None:
            raise AdapterError("nothing to roll back: the base model is in use")
        if history and history[-1] == pointer.get("current"):
            history.pop()
        previous = history[-1] if history else None
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic_write_json(self.root / POINTER_NAME,
                           {"current": previous, "history": history, "updated_at": time.time()})
        return previous


def sync_runtime_adapter(runtime, root: Path) -> bool:
    """Apply to `runtime` the adapter the pointer under `root` names (or the base model); True when
    the runtime changed. A promoted adapter that does not load leaves the base model in place."""
    from context.adapters import apply_adapter, remove_adapter

    wanted = read_pointer(root).get("current")
    if wanted == runtime.adapter_id:
        return False
    if wanted is None:
        remove_adapter(runtime)
        return True
    try:
        apply_adapter(runtime, Path(root) / "versions" / wanted, wanted)
    except AdapterError:
        remove_adapter(runtime)
        raise
    return True
