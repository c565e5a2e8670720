"""The converted-model cache heals itself: a damaged copy is detected, removed and converted again.

Every test works on its own copy of the converted model (hard links to the real cache's large
weights file; a damaged file is always replaced, never written in place), so the machine's real
cache is never touched. Only one test pays for a real GGUF conversion (~20 s); the others replace
the converter with one that restores a pristine copy, since what they check is the detection.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from context import runtime as runtime_module
from context.config import ModelConfig
from context.errors import ModelLoadError
from context.runtime import (
    CACHE_FORMAT,
    CACHE_MANIFEST,
    ModelRuntime,
    cache_is_complete,
    converted_dir_for,
    locate_embedded_gguf,
)

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def pristine(model_cache_dir) -> Path:
    """The real cache's converted copy of the embedded model (read only for these tests)."""
    target = converted_dir_for(locate_embedded_gguf(), model_cache_dir)
    assert cache_is_complete(target), f"the shared converted model at {target} is incomplete"
    sizes = {p.name: p.stat().st_size for p in target.iterdir()}
    yield target
    # Nothing these tests did may have reached the real cache.
    assert cache_is_complete(target)
    assert {p.name: p.stat().st_size for p in target.iterdir()} == sizes


def _link_or_copy_tree(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for item in source.iterdir():
        if item.name == WEIGHTS:
            try:
                os.link(item, dest / item.name)
                continue
            except OSError:
                pass
        shutil.copy2(item, dest / item.name)


def _replace_file(path: Path, data: bytes) -> None:
    """Give `path` new contents without writing through a hard link into the real cache."""
    path.unlink()
    path.write_bytes(data)


def _damage_keeping_size(path: Path, garbage: bytes) -> None:
    """Replace `path` by garbage of the same size (a sparse tail, so 500 MB cost nothing)."""
    size = path.stat().st_size
    head = (garbage * (min(size, 1 << 16) // len(garbage) + 1))[: min(size, 1 << 16)]
    path.unlink()
    with path.open("wb") as handle:
        handle.write(head)
        handle.truncate(size)


@pytest.fixture
def cache(tmp_path, pristine) -> Path:
    """A private cache dir holding a copy of the converted model; returns the cache dir."""
    cache_dir = tmp_path / "cache"
    _link_or_copy_tree(pristine, cache_dir / "models" / pristine.name)
    return cache_dir


def _target(cache_dir: Path) -> Path:
    return converted_dir_for(locate_embedded_gguf(), cache_dir)


@pytest.fixture
def fake_convert(monkeypatch, pristine) -> list[Path]:
    """Replace the ~20 s GGUF conversion by restoring the pristine copy; records each call."""
    calls: list[Path] = []

    def convert(gguf: Path, target: Path) -> None:
        calls.append(target)
        staging = target.with_name(f"{target.name}.tmp-test")
        shutil.rmtree(staging, ignore_errors=True)
        _link_or_copy_tree(pristine, staging)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)

    monkeypatch.setattr(runtime_module, "_convert_gguf", convert)
    return calls


def _assert_manifest_valid(target: Path, pristine: Path) -> None:
    manifest = json.loads((target / CACHE_MANIFEST).read_text())
    assert manifest["format"] == CACHE_FORMAT
    files = manifest["files"]
    assert WEIGHTS in files and "config.json" in files and "tokenizer.json" in files, files
    for name, size in files.items():
        assert (target / name).stat().st_size == size, name
    assert files[WEIGHTS] == (pristine / WEIGHTS).stat().st_size
    assert cache_is_complete(target)


def _assert_generates(runtime: ModelRuntime) -> None:
    result = runtime.generate("def add(a, b):\n    return", max_new_tokens=3)
    assert result.new_tokens > 0 and result.text.strip(), result


def test_intact_copy_loads_from_cache(cache, fake_convert):
    runtime = ModelRuntime(ModelConfig(), cache).load()
    assert runtime.loaded_from_cache
    assert fake_convert == []


def test_truncated_weights_are_converted_again(cache, pristine, capsys):
    """A real reconversion: the copy fails the manifest's size check and is rebuilt from GGUF,
    its stages shown on stderr (stdout may be the LSP stream)."""
    target = _target(cache)
    with (target / WEIGHTS).open("rb") as handle:
        head = handle.read(1 << 20)
    _replace_file(target / WEIGHTS, head)
    assert not cache_is_complete(target)

    runtime = ModelRuntime(ModelConfig(cache_dir=str(cache))).load()

    assert not runtime.loaded_from_cache
    assert runtime.cache_dir == cache
    out, err = capsys.readouterr()
    assert out == ""
    shown = [line for line in err.splitlines() if line.startswith("squidcode: converting ")]
    assert shown[0].endswith(": started, 3 stages")
    assert "1/3 stages (33%)" in shown[1] and "stage=dequantizing the weights" in shown[1]
    assert re.search(r": done, 3/3 stages \(100%\) in [\d.]+s$", shown[-1])
    _assert_manifest_valid(target, pristine)
    # The conversion was atomic: no staging directory is left next to the copy.
    assert [p.name for p in (cache / "models").iterdir()] == [target.name]
    _assert_generates(runtime)
    # The next start uses the rebuilt copy.
    assert ModelRuntime(ModelConfig(), cache).load().loaded_from_cache


@pytest.mark.parametrize(
    "name, garbage",
    [
        # Passes the manifest's size check, but safetensors cannot read the header.
        pytest.param(WEIGHTS, b"\xff" * 4096, id="weights-header"),
        pytest.param("tokenizer.json", b"x", id="tokenizer-json"),
        pytest.param("config.json", b"{", id="config-json"),
    ],
)
def test_same_size_corruption_is_converted_again(cache, pristine, fake_convert, name, garbage):
    """A copy that passes the manifest check but does not load is removed and rebuilt."""
    target = _target(cache)
    _damage_keeping_size(target / name, garbage)
    assert cache_is_complete(target), "the damage should pass the size check"

    runtime = ModelRuntime(ModelConfig(), cache).load()

    assert fake_convert == [target]
    assert not runtime.loaded_from_cache
    _assert_manifest_valid(target, pristine)
    _assert_generates(runtime)


def test_missing_manifest_is_converted_again(cache, pristine, fake_convert):
    target = _target(cache)
    (target / CACHE_MANIFEST).unlink()

    runtime = ModelRuntime(ModelConfig(), cache).load()

    assert fake_convert == [target]
    assert not runtime.loaded_from_cache
    _assert_manifest_valid(target, pristine)
    _assert_generates(runtime)


@pytest.mark.parametrize(
    "manifest",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
        pytest.param(b"[]", id="a-list"),
        pytest.param(b'{"files": {}}', id="no-format"),
        pytest.param(json.dumps({"format": CACHE_FORMAT + 1, "files": {}}).encode(), id="newer-format"),
        pytest.param(json.dumps({"format": CACHE_FORMAT}).encode(), id="no-files"),
        pytest.param(json.dumps({"format": CACHE_FORMAT, "files": ["a"]}).encode(), id="files-list"),
        pytest.param(
            json.dumps({"format": CACHE_FORMAT, "files": {"gone.bin": 1}}).encode(), id="missing-file"
        ),
        pytest.param(
            json.dumps({"format": CACHE_FORMAT, "files": {"config.json": "big"}}).encode(),
            id="size-not-a-number",
        ),
    ],
)
def test_bad_manifest_fails_the_check(cache, manifest):
    target = _target(cache)
    _replace_file(target / CACHE_MANIFEST, manifest)
    assert cache_is_complete(target) is False


def test_bad_manifest_is_converted_again(cache, pristine, fake_convert):
    target = _target(cache)
    _replace_file(target / CACHE_MANIFEST, b"{not json")

    assert not ModelRuntime(ModelConfig(), cache).load().loaded_from_cache

    assert fake_convert == [target]
    _assert_manifest_valid(target, pristine)


def test_missing_copy_is_converted(tmp_path, pristine, fake_convert):
    cache_dir = tmp_path / "empty-cache"
    runtime = ModelRuntime(ModelConfig(), cache_dir).load()
    assert fake_convert == [_target(cache_dir)]
    _assert_manifest_valid(_target(cache_dir), pristine)
    assert not runtime.loaded_from_cache


def test_unwritable_cache_dir_is_a_clear_error(tmp_path):
    not_a_dir = tmp_path / "cache-is-a-file"
    not_a_dir.write_text("")
    with pytest.raises(ModelLoadError, match="Cannot write the converted model"):
        ModelRuntime(ModelConfig(), not_a_dir).load()


def test_corrupt_user_model_dir_is_a_model_load_error(tmp_path, pristine):
    """A damaged model directory the user pointed at is reported, not converted or crashed on."""
    model_dir = tmp_path / "my-model"
    _link_or_copy_tree(pristine, model_dir)
    size = (model_dir / WEIGHTS).stat().st_size
    _damage_keeping_size(model_dir / WEIGHTS, b"\xff")
    with pytest.raises(ModelLoadError, match="Cannot load the model"):
        ModelRuntime(ModelConfig(path=str(model_dir)), tmp_path / "cache").load()
    # The user's files are left alone.
    assert (model_dir / WEIGHTS).stat().st_size == size
