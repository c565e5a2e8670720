"""The tiered store of document caches: device memory -> CPU memory -> disk, each with a byte budget.

- `get(key)` looks in the device tier, then CPU memory, then disk; a hit below the device tier is
  promoted to it (and may push the least recently used entries down).
- `put(entry)` places a new entry on the device tier; `evict_to_budget` demotes least recently used
  entries device -> CPU -> disk (written atomically) and deletes the oldest files past the disk
  budget. An entry larger than a tier's whole budget skips that tier.
- A disk entry that is truncated, corrupt, of another format version or of another key is removed
  and counted (`corrupt`); the caller encodes the document again. A failed write (a full disk) is
  counted (`write_errors`), the temporary file removed, and the entry simply not kept on disk.
- `invalidate_source(path)` drops every entry encoded from that file (the watcher calls it).

On a machine without an accelerator the device tier is CPU memory too; it keeps its own budget.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CacheEntryCorrupt
from .disk import SUFFIX, read_entry, read_metadata, write_entry
from .encode import DocumentKV
from .keys import CacheKey

__all__ = ["KVCacheStore", "TierStats"]

log = logging.getLogger(__name__)


@dataclass
class TierStats:
    """Counters of one tier."""

    hits: int = 0
    misses: int = 0
    bytes: int = 0
    entries: int = 0
    evictions: int = 0  # entries that left this tier for lack of room (demoted or deleted)
    budget: int = 0


class _MemoryTier:
    def __init__(self, name: str, device: str, budget: int):
        self.name, self.device, self.budget = name, device, budget
        self.entries: OrderedDict[CacheKey, DocumentKV] = OrderedDict()
        self.stats = TierStats(budget=budget)

    def add(self, entry: DocumentKV) -> None:
        old = self.entries.pop(entry.key, None)
        if old is not None:
            self.stats.bytes -= old.nbytes
        self.entries[entry.key] = entry.to(self.device)
        self.stats.bytes += entry.nbytes
        self.stats.entries = len(self.entries)

    def pop(self, key: CacheKey) -> DocumentKV | None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.stats.bytes -= entry.nbytes
            self.stats.entries = len(self.entries)
        return entry

    def pop_oldest(self) -> DocumentKV:
        key = next(iter(self.entries))
        return self.pop(key)


class KVCacheStore:
    """Document caches in three tiers with LRU eviction; thread-safe."""

    def __init__(self, disk_dir: Path | None, *, device: str = "cpu", device_bytes: int = 256 << 20,
                 cpu_bytes: int = 1 << 30, disk_bytes: int = 4 << 30):
        self.device_tier = _MemoryTier("device", device, device_bytes)
        self.cpu_tier = _MemoryTier("cpu", "cpu", cpu_bytes)
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self.disk_budget = disk_bytes if disk_dir is not None else 0
        self.disk_stats = TierStats(budget=self.disk_budget)
        self.write_errors = 0
        self.corrupt = 0
        self._disk: OrderedDict[str, int] = OrderedDict()  # digest -> file size, oldest first
        self._sources: dict[str, str | None] = {}  # digest -> source file, learnt lazily
        self._lock = threading.RLock()
        if self.disk_dir is not None:
            self._scan_disk()

    # -- disk bookkeeping ----------------------------------------------------------------------

    def path_for(self, key: CacheKey) -> Path:
        digest = key.digest
        return self.disk_dir / digest[:2] / f"{digest}{SUFFIX}"

    def _scan_disk(self) -> None:
        found = []
        for path in self.disk_dir.glob(f"*/*{SUFFIX}"):
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append((stat.st_mtime, path.stem, stat.st_size))
        for _, digest, size in sorted(found):
            self._disk[digest] = size
        self._refresh_disk_stats()

    def _refresh_disk_stats(self) -> None:
        self.disk_stats.bytes = sum(self._disk.values())
        self.disk_stats.entries = len(self._disk)

    def _remove_file(self, digest: str) -> None:
        self._disk.pop(digest, None)
        self._sources.pop(digest, None)
        (self.disk_dir / digest[:2] / f"{digest}{SUFFIX}").unlink(missing_ok=True)
        self._refresh_disk_stats()

    def _write_disk(self, entry: DocumentKV) -> bool:
        if self.disk_dir is None or entry.nbytes > self.disk_budget:
            return False
        path = self.path_for(entry.key)
        try:
            size = write_entry(path, entry)
        except OSError as exc:
            self.write_errors += 1
            log.warning("cannot write the Squid cache entry %s (%s); kept in memory only", path, exc)
            return False
        with self._lock:
            self._disk.pop(entry.key.digest, None)
            self._disk[entry.key.digest] = size
            self._sources[entry.key.digest] = entry.source
            self._refresh_disk_stats()
            self._evict_disk()
        return True

    def _evict_disk(self) -> None:
        while self._disk and self.disk_stats.bytes > self.disk_budget:
            oldest = next(iter(self._disk))
            self._remove_file(oldest)
            self.disk_stats.evictions += 1

    def _read_disk(self, key: CacheKey) -> DocumentKV | None:
        if self.disk_dir is None:
            return None
        path = self.path_for(key)
        try:
            entry = read_entry(path, key, self.device_tier.device)
        except FileNotFoundError:
            return None
        except (CacheEntryCorrupt, OSError) as exc:
            log.warning("discarding the Squid cache entry %s: %s", path, exc)
            with self._lock:
                self.corrupt += 1
                self._remove_file(key.digest)
            return None
        with self._lock:
            self._disk.pop(key.digest, None)
            self._disk[key.digest] = path.stat().st_size if path.exists() else 0
            self._refresh_disk_stats()
        try:
            os.utime(path)  # the LRU order survives a restart
        except OSError:
            pass
        return entry

    # -- the public surface ----------------------------------------------------------------------

    def get(self, key: CacheKey) -> DocumentKV | None:
        """The entry for `key`, promoted to the device tier; None when no tier has it (or it was bad)."""
        with self._lock:
            entry = self.device_tier.entries.get(key)
            if entry is not None:
                self.device_tier.entries.move_to_end(key)
                self.device_tier.stats.hits += 1
                return entry
            self.device_tier.stats.misses += 1
            entry = self.cpu_tier.pop(key)
            if entry is not None:
                self.cpu_tier.stats.hits += 1
                return self._promote(entry)
            self.cpu_tier.stats.misses += 1
        entry = self._read_disk(key)
        with self._lock:
            if entry is None:
                self.disk_stats.misses += 1
                return None
            self.disk_stats.hits += 1
            return self._promote(entry)

    def _promote(self, entry: DocumentKV) -> DocumentKV:
        self.device_tier.add(entry)
        promoted = self.device_tier.entries[entry.key]
        self.evict_to_budget()
        return promoted

    def contains(self, key: CacheKey) -> bool:
        """Whether any tier holds `key` (no stats, no promotion, no disk read)."""
        with self._lock:
            return (key in self.device_tier.entries or key in self.cpu_tier.entries
                    or key.digest in self._disk)

    def put(self, entry: DocumentKV) -> None:
        with self._lock:
            self.cpu_tier.pop(entry.key)
            self.device_tier.add(entry)
            self.evict_to_budget()

    def persist(self, key: CacheKey) -> bool:
        """Write the entry to disk now (background pre-encode does, so restarts find it)."""
        with self._lock:
            entry = self.device_tier.entries.get(key) or self.cpu_tier.entries.get(key)
            if entry is None or key.digest in self._disk:
                return key.digest in self._disk
        return self._write_disk(entry)

    def evict_to_budget(self) -> None:
        """Demote least recently used entries until every tier is within its budget."""
        to_disk: list[DocumentKV] = []
        with self._lock:
            device, cpu = self.device_tier, self.cpu_tier
            while device.entries and device.stats.bytes > device.budget:
                entry = device.pop_oldest()
                device.stats.evictions += 1
                if entry.nbytes <= cpu.budget:
                    cpu.add(entry)
                else:
                    to_disk.append(entry)
            while cpu.entries and cpu.stats.bytes > cpu.budget:
                cpu.stats.evictions += 1
                to_disk.append(cpu.pop_oldest())
            to_disk = [e for e in to_disk if e.key.digest not in self._disk]
        for entry in to_disk:
            self._write_disk(entry)

    def release_memory(self) -> int:
        """Drop every entry the memory tiers hold; those on disk stay there for the next `get`.
        Returns the bytes let go."""
        with self._lock:
            released = 0
            for tier in (self.device_tier, self.cpu_tier):
                while tier.entries:
                    released += tier.pop_oldest().nbytes
            return released

    def invalidate(self, key: CacheKey) -> None:
        with self._lock:
            self.device_tier.pop(key)
            self.cpu_tier.pop(key)
            if self.disk_dir is not None:
                self._remove_file(key.digest)

    def invalidate_source(self, source: str, keep: CacheKey | None = None) -> int:
        """Drop every entry encoded from the file `source` (except `keep`); returns how many."""
        with self._lock:
            digests = {k.digest: k for tier in (self.device_tier, self.cpu_tier)
                       for k, e in tier.entries.items() if e.source == source}
            digests.update({d: None for d in list(self._disk) if d not in digests
                            and self._disk_source(d) == source})
            if keep is not None:
                digests.pop(keep.digest, None)
            for digest, key in digests.items():
                if key is not None:
                    self.device_tier.pop(key)
                    self.cpu_tier.pop(key)
                if self.disk_dir is not None:
                    self._remove_file(digest)
            return len(digests)

    def _disk_source(self, digest: str) -> str | None:
        if digest not in self._sources:
            path = self.disk_dir / digest[:2] / f"{digest}{SUFFIX}"
            try:
                self._sources[digest] = read_metadata(path).get("source") or None
            except (OSError, CacheEntryCorrupt):
                return None
        return self._sources[digest]

    def stats(self) -> dict:
        with self._lock:
            return {
                "device": asdict(self.device_tier.stats),
                "cpu": asdict(self.cpu_tier.stats),
                "disk": {**asdict(self.disk_stats), "write_errors": self.write_errors,
                         "corrupt": self.corrupt},
            }
