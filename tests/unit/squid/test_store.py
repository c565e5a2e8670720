"""The tiered store: LRU demotion and promotion, byte budgets, persistence, and every bad disk entry
(truncated, corrupt, checksum, version, key, full disk, two writers) detected and never used."""

from __future__ import annotations

import errno
import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from context.squid import disk as disk_module
from context.squid.disk import read_entry, write_entry
from context.squid.keys import CacheKey
from context.squid.store import KVCacheStore

from .conftest import make_entry

REPO = Path(__file__).resolve().parents[3]


def _same(a, b) -> bool:
    return (a.key == b.key and a.token_ids == b.token_ids and a.start == b.start and a.source == b.source
            and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values))


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_put_get_round_trip_counts_a_device_hit(tmp_path):
    store = KVCacheStore(tmp_path)
    entry = make_entry("a")
    store.put(entry)
    assert _same(store.get(entry.key), entry)
    assert store.get(make_entry("missing").key) is None
    stats = store.stats()
    assert stats["device"]["hits"] == 1 and stats["device"]["misses"] == 1
    assert stats["disk"]["misses"] == 1
    assert stats["device"]["bytes"] == entry.nbytes and stats["device"]["entries"] == 1


def test_lru_demotes_device_to_cpu_to_disk_and_promotes_back(tmp_path):
    size = make_entry("x").nbytes
    store = KVCacheStore(tmp_path, device_bytes=2 * size, cpu_bytes=size, disk_bytes=100 * size)
    a, b, c, d = (make_entry(n, seed=i) for i, n in enumerate("abcd"))
    for entry in (a, b, c):
        store.put(entry)
    # c pushed a (least recently used) down to the CPU tier.
    assert list(store.device_tier.entries) == [b.key, c.key]
    assert list(store.cpu_tier.entries) == [a.key]
    store.put(d)  # b down to CPU, which pushes a to disk
    assert list(store.cpu_tier.entries) == [b.key]
    assert store.path_for(a.key).is_file()
    stats = store.stats()
    assert stats["device"]["evictions"] == 2 and stats["cpu"]["evictions"] == 1

    got = store.get(a.key)  # from disk, verified, promoted to the device tier
    assert _same(got, a)
    assert a.key in store.device_tier.entries
    assert store.stats()["disk"]["hits"] == 1

    # Promoting a pushed c down to the CPU tier, and b from there to disk.
    assert list(store.device_tier.entries) == [d.key, a.key]
    assert list(store.cpu_tier.entries) == [c.key]
    got_c = store.get(c.key)  # from CPU memory
    assert _same(got_c, c) and store.stats()["cpu"]["hits"] == 1
    assert c.key not in store.cpu_tier.entries
    assert _same(store.get(b.key), b) and store.stats()["disk"]["hits"] == 2


def test_release_memory_empties_both_memory_tiers_and_keeps_the_disk(tmp_path):
    size = make_entry("x").nbytes
    store = KVCacheStore(tmp_path, device_bytes=size, cpu_bytes=size, disk_bytes=100 * size)
    a, b, c = (make_entry(n, seed=i) for i, n in enumerate("abc"))
    for entry in (a, b, c):
        store.put(entry)  # c in the device tier, b in the CPU tier, a on disk
    assert store.release_memory() == 2 * size
    assert not store.device_tier.entries and not store.cpu_tier.entries
    stats = store.stats()
    assert stats["device"]["bytes"] == stats["cpu"]["bytes"] == 0
    assert _same(store.get(a.key), a)  # what was on disk still is
    assert store.get(c.key) is None  # what only memory held is gone, not written out
    assert store.release_memory() == size  # a, promoted by the get


def test_budgets_hold_under_a_stream_of_requests(tmp_path):
    size = make_entry("x").nbytes
    store = KVCacheStore(tmp_path, device_bytes=3 * size, cpu_bytes=4 * size, disk_bytes=6 * size)
    rng = random.Random(7)
    entries = [make_entry(f"doc{i}", seed=i) for i in range(20)]
    for step in range(300):
        entry = rng.choice(entries)
        got = store.get(entry.key)
        if got is None:
            store.put(entry)
        else:
            assert _same(got, entry), f"step {step}: wrong entry served"
        stats = store.stats()
        for tier in ("device", "cpu", "disk"):
            assert stats[tier]["bytes"] <= stats[tier]["budget"], (step, tier, stats[tier])
    disk_bytes = sum(p.stat().st_size for p in _files(tmp_path))
    assert disk_bytes == store.stats()["disk"]["bytes"] <= 6 * size


def test_an_entry_larger_than_a_tier_skips_it(tmp_path):
    big = make_entry("big", seq=64)
    store = KVCacheStore(tmp_path, device_bytes=big.nbytes // 2, cpu_bytes=big.nbytes // 2,
                         disk_bytes=10 * big.nbytes)
    store.put(big)
    assert not store.device_tier.entries and not store.cpu_tier.entries
    assert store.path_for(big.key).is_file()
    assert _same(KVCacheStore(tmp_path).get(big.key), big)


def test_persisted_entries_survive_a_restart(tmp_path):
    entry = make_entry("persist", source="/w/a.py")
    first = KVCacheStore(tmp_path)
    first.put(entry)
    assert first.persist(entry.key)
    second = KVCacheStore(tmp_path)
    assert second.stats()["disk"]["entries"] == 1
    assert _same(second.get(entry.key), entry)


def _persisted(tmp_path, name="e"):
    store = KVCacheStore(tmp_path)
    entry = make_entry(name)
    store.put(entry)
    store.persist(entry.key)
    return entry, store.path_for(entry.key)


def _assert_rejected_and_removed(tmp_path, entry, path):
    fresh = KVCacheStore(tmp_path)
    assert fresh.get(entry.key) is None
    assert not path.exists(), "a bad entry must be removed so it is encoded again"
    assert fresh.stats()["disk"]["corrupt"] == 1


@pytest.mark.parametrize(
    "keep", [0, 5, 8, 200, -1], ids=["empty", "in-length", "in-header", "in-data", "last-byte"]
)
def test_truncated_file_is_rejected(tmp_path, keep):
    entry, path = _persisted(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    _assert_rejected_and_removed(tmp_path, entry, path)


def test_flipped_tensor_byte_fails_the_checksum(tmp_path):
    entry, path = _persisted(tmp_path)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(disk_module.CacheEntryCorrupt, match="checksum"):
        read_entry(path, entry.key)
    _assert_rejected_and_removed(tmp_path, entry, path)


def test_garbage_header_is_rejected(tmp_path):
    entry, path = _persisted(tmp_path)
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    path.write_bytes(data[:8] + b"{" * size + data[8 + size :])
    _assert_rejected_and_removed(tmp_path, entry, path)


def _rewrite_metadata(path: Path, **changes) -> None:
    import safetensors.torch
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        meta = handle.metadata()
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    meta.update(changes)
    path.write_bytes(safetensors.torch.save(tensors, metadata=meta))


def test_other_format_version_is_rejected(tmp_path):
    entry, path = _persisted(tmp_path)
    _rewrite_metadata(path, format="999")
    with pytest.raises(disk_module.CacheEntryCorrupt, match="format version"):
        read_entry(path, entry.key)
    _assert_rejected_and_removed(tmp_path, entry, path)


def test_metadata_checksum_mismatch_is_rejected(tmp_path):
    entry, path = _persisted(tmp_path)
    _rewrite_metadata(path, checksum="00000000")
    _assert_rejected_and_removed(tmp_path, entry, path)


def test_shapes_that_disagree_with_the_metadata_are_rejected(tmp_path):
    entry, path = _persisted(tmp_path)
    _rewrite_metadata(path, shape=json.dumps([1, 1, 1, 1]))
    _assert_rejected_and_removed(tmp_path, entry, path)


def test_a_file_holding_another_key_is_never_served(tmp_path):
    entry, path = _persisted(tmp_path, "one")
    other = make_entry("two").key
    store = KVCacheStore(tmp_path)
    target = store.path_for(other)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(path.read_bytes())
    fresh = KVCacheStore(tmp_path)
    assert fresh.get(other) is None
    assert _same(fresh.get(entry.key), entry)


def test_changed_model_or_adapter_never_reuses_an_entry(tmp_path):
    entry, _ = _persisted(tmp_path)
    store = KVCacheStore(tmp_path)
    for key in (CacheKey("model-b", None, "prefix-1", "e"), CacheKey("model-a", "adapter-7", "prefix-1", "e"),
                CacheKey("model-a", None, "prefix-2", "e"), CacheKey("model-a", None, "prefix-1", "e", 99)):
        assert store.get(key) is None
    assert _same(store.get(entry.key), entry)


class FullDiskDouble:
    """Stands in for a full file system: every write raises ENOSPC (a tmpfs cannot be mounted here)."""

    def __init__(self, real_open):
        self.real_open = real_open
        self.calls = 0

    def __call__(self, path, mode="r", *args, **kwargs):
        handle = self.real_open(path, mode, *args, **kwargs)
        if "w" not in mode:
            return handle
        self.calls += 1
        double = self

        class _Full:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                handle.close()

            def write(self, data):
                handle.write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")

            def flush(self):
                pass

            def fileno(self):
                return handle.fileno()

        assert double
        return _Full()


def test_full_disk_keeps_the_entry_in_memory_and_leaves_no_partial_file(tmp_path, monkeypatch):
    double = FullDiskDouble(open)
    monkeypatch.setattr(disk_module, "open", double, raising=False)
    size = make_entry("x").nbytes
    store = KVCacheStore(tmp_path, device_bytes=size, cpu_bytes=size)
    a, b, c = (make_entry(n, seed=i) for i, n in enumerate("abc"))
    store.put(a)
    assert store.persist(a.key) is False
    assert double.calls == 1
    assert store.stats()["disk"]["write_errors"] == 1
    assert _files(tmp_path) == [], "the temporary file must be removed"
    assert _same(store.get(a.key), a), "the entry is still served from memory"
    store.put(b)
    store.put(c)  # a is demoted off the CPU tier; its disk write fails too
    assert store.stats()["disk"]["write_errors"] == 2
    assert store.get(a.key) is None  # gone, so the caller encodes it again
    assert _same(store.get(c.key), c)
    monkeypatch.undo()
    store.put(a)
    assert store.persist(a.key) and _same(KVCacheStore(tmp_path).get(a.key), a)


_WRITER = """
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.unit.squid.conftest import make_entry
from context.squid.disk import write_entry
entry = make_entry("shared", seq=64, seed={seed})
for _ in range(30):
    write_entry(Path({path!r}), entry)
"""


def test_two_processes_writing_the_same_entry_leave_one_whole_file(tmp_path):
    store = KVCacheStore(tmp_path)
    key = make_entry("shared").key
    path = store.path_for(key)
    path.parent.mkdir(parents=True)
    # Different tensors per writer: a reader must get one writer's entry whole, never a mix.
    expected = [make_entry("shared", seq=64, seed=s) for s in (1, 2)]
    scripts = [_WRITER.format(repo=str(REPO), seed=s, path=str(path)) for s in (1, 2)]
    writers = [subprocess.Popen([sys.executable, "-c", script]) for script in scripts]
    reads = 0
    while any(w.poll() is None for w in writers):
        try:
            got = read_entry(path, key)
        except FileNotFoundError:
            continue
        reads += 1
        assert any(_same(got, e) for e in expected)
    assert [w.returncode for w in writers] == [0, 0]
    got = read_entry(path, key)
    assert any(_same(got, e) for e in expected)
    assert _files(tmp_path) == [path], "no temporary file may be left behind"


def test_invalidate_source_drops_every_tier(tmp_path):
    size = make_entry("x").nbytes
    store = KVCacheStore(tmp_path, device_bytes=size, cpu_bytes=size)
    a, b, c = (make_entry(n, source="/w/a.py", seed=i) for i, n in enumerate("abc"))
    other = make_entry("other", source="/w/b.py")
    for entry in (a, b, c, other):
        store.put(entry)
    assert store.path_for(a.key).is_file()  # a and b were demoted to disk
    assert store.invalidate_source("/w/a.py", keep=c.key) == 2
    assert store.get(a.key) is None and store.get(b.key) is None
    assert not store.path_for(a.key).exists()
    assert _same(store.get(c.key), c) and _same(store.get(other.key), other)
    # A restart learns the sources of files it did not write from their headers.
    store.persist(c.key)
    assert KVCacheStore(tmp_path).invalidate_source("/w/a.py") == 1


def test_write_entry_is_atomic_on_interrupt(tmp_path, monkeypatch):
    entry = make_entry("a")
    path = tmp_path / "e.safetensors"
    write_entry(path, entry)

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(disk_module.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_entry(path, make_entry("a", seed=5))
    assert _files(tmp_path) == [path]
    assert _same(read_entry(path, entry.key), entry), "the old entry is intact"
