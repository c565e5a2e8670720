"""Model loads never interfere: threads in one process, and processes sharing one cache dir.

transformers patches torch process-wide while it builds a model, so two loads in two threads could
leave one model's parameters on the meta device; a server loads the language model and the
embedding ranker in different threads, and swaps adapters in a third. Two processes starting on
an empty cache convert the GGUF file once, not twice over each other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from context import runtime as runtime_module
from context.config import ModelConfig
from context.loading import file_lock, model_loading
from context.runtime import (
    ModelRuntime,
    cache_is_complete,
    conversion_lock_for,
    converted_dir_for,
    locate_embedded_gguf,
)

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter, so that transformers' lazy imports race as well: the language model twice
# and the embedding model, each in its own thread, all started together.
CONCURRENT_LOADS = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from context.config import ModelConfig
    from context.index import embeddings
    from context.runtime import ModelRuntime

    cache = Path(sys.argv[1])
    results = {}

    def language_model(name):
        try:
            runtime = ModelRuntime(ModelConfig(), cache).load()
            out = runtime.generate("def add(a, b):\\n    return", max_new_tokens=2)
            results[name] = "ok" if out.new_tokens > 0 else "no tokens"
        except Exception as exc:
            results[name] = f"{type(exc).__name__}: {exc}"

    def embedding_model():
        try:
            vectors = embeddings._load_model(True)[1]
            results["embeddings"] = "ok"
        except Exception as exc:
            results["embeddings"] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=language_model, args=("lm1",)),
               threading.Thread(target=embedding_model),
               threading.Thread(target=language_model, args=("lm2",))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in sorted(results):
        print(name, results[name])
    """
)


def test_concurrent_loads_in_one_process_all_succeed(model_cache_dir):
    proc = subprocess.run(
        [sys.executable, "-c", CONCURRENT_LOADS, str(model_cache_dir)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=240,
    )
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line[:3] in ("lm1", "lm2", "emb"))
    assert lines == {"lm1": "ok", "lm2": "ok", "embeddings": "ok"}, proc.stdout + proc.stderr[-3000:]


def test_model_loading_lock_is_reentrant_and_exclusive():
    order: list[str] = []
    with model_loading(), model_loading():  # a load inside a load does not deadlock
        worker = threading.Thread(target=lambda: (model_loading().__enter__(), order.append("worker")))
        worker.start()
        worker.join(0.3)
        order.append("holder")  # the worker is still waiting while this thread holds the lock
    worker.join(5)
    assert order == ["holder", "worker"]


HOLD_LOCK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from context.loading import file_lock
    with file_lock(Path(sys.argv[1])):
        print("locked", flush=True)
        time.sleep(float(sys.argv[2]))
    """
)


def test_file_lock_excludes_another_process(tmp_path):
    lock = tmp_path / "locks" / "model.lock"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock), "1.5"], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with file_lock(lock):
            waited = time.monotonic() - started
        assert child.wait(10) == 0
    finally:
        child.kill()
    assert waited > 0.5, f"the lock was taken after {waited:.2f} s while the other process held it"


def test_file_lock_is_released_when_its_holder_is_killed(tmp_path):
    lock = tmp_path / "model.lock"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock), "60"], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline().strip() == "locked"
    child.kill()
    child.wait(10)
    started = time.monotonic()
    with file_lock(lock):
        pass
    assert time.monotonic() - started < 5


def test_a_load_waiting_on_another_processes_conversion_uses_its_copy(tmp_path, model_cache_dir, monkeypatch):
    """While one converter holds the lock, a second start waits, then finds the finished copy."""
    pristine = converted_dir_for(locate_embedded_gguf(), model_cache_dir)
    assert cache_is_complete(pristine)
    cache_dir = tmp_path / "cache"
    target = converted_dir_for(locate_embedded_gguf(), cache_dir)
    conversions: list[Path] = []
    monkeypatch.setattr(runtime_module, "_convert_gguf", lambda gguf, dest: conversions.append(dest))

    result: dict[str, object] = {}
    with file_lock(conversion_lock_for(target)):  # "another process" converting
        def load() -> None:
            result["runtime"] = ModelRuntime(ModelConfig(), cache_dir).load()

        loader = threading.Thread(target=load)
        loader.start()
        loader.join(1.0)
        assert loader.is_alive(), "the load did not wait for the conversion in progress"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(pristine, target)  # the other process's finished copy
    loader.join(120)

    assert conversions == [], "the waiting load converted the model a second time"
    assert result["runtime"].loaded_from_cache


def test_half_written_conversions_of_killed_processes_are_removed(tmp_path):
    import subprocess
    import sys

    from context.runtime import drop_orphaned_conversions

    target = tmp_path / "SmolLM2-abc"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    living = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for pid in (gone.pid, living.pid, os.getpid()):
            (tmp_path / f"SmolLM2-abc.tmp-{pid}-1").mkdir()
            (tmp_path / f"SmolLM2-abc.tmp-{pid}-1" / "model.safetensors").write_bytes(b"half")
        (tmp_path / "SmolLM2-other.tmp-1-1").mkdir()  # another model's: not ours to touch
        removed = drop_orphaned_conversions(target)
        assert [p.name for p in removed] == [f"SmolLM2-abc.tmp-{gone.pid}-1"]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f"SmolLM2-abc.tmp-{living.pid}-1", f"SmolLM2-abc.tmp-{os.getpid()}-1", "SmolLM2-other.tmp-1-1"])
    finally:
        living.kill()
        living.wait()
