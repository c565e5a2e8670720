"""`squidcode index`, `search` and `map` as a user runs them, on a small real project."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "lsp_server", "--log-level", "warning"]

FILES = {
    "geometry/shapes.py": "import math\n\n\nclass Circle:\n    def __init__(self, radius):\n"
                          "        self.radius = radius\n\n    def area(self):\n"
                          "        return math.pi * self.radius ** 2\n",
    "geometry/render.py": "from geometry.shapes import Circle\n\n\ndef draw_circle(radius):\n"
                          "    return Circle(radius).area()\n",
    "tools/slugify.go": "package tools\n\nfunc Slugify(title string) string {\n\treturn title\n}\n",
    "image.png": "\x89PNG\x00\x00binary",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        path = tmp_path / "proj" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "proj"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_index_json_counts_files_chunks_symbols_and_skips(project):
    out = run("index", str(project), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert set(report) == {"files", "chunks", "symbols", "skipped", "seconds"}
    assert report["files"] == 3
    assert report["skipped"] == {"binary": 1}
    assert report["symbols"] >= 5  # Circle, __init__, area, draw_circle, Slugify
    assert report["chunks"] >= 3


def test_index_shows_progress_on_stderr_and_its_result_on_stdout(project):
    out = run("index", str(project))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"indexed {project.resolve()}: 3 files")
    assert len(out.stdout.splitlines()) == 1
    progress = [line for line in out.stderr.splitlines() if line.startswith("squidcode: indexing ")]
    assert progress[0] == f"squidcode: indexing {project.resolve()}: started"
    assert progress[-1].startswith(f"squidcode: indexing {project.resolve()}: done, 3/3 files (100%) in ")


def test_search_finds_the_definition_first_with_relative_paths(project):
    out = run("search", str(project), "where is draw_circle defined", "-k", "3", "--json")
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)
    assert hits[0]["path"] == "geometry/render.py"
    assert hits[0]["symbol"] == "draw_circle"
    assert hits[0]["start_line"] <= 4 <= hits[0]["end_line"]
    assert set(hits[0]) == {"path", "start_line", "end_line", "symbol", "score"}
    assert len(hits) <= 3


def test_search_picks_up_changes_after_reindex(project):
    assert run("index", str(project)).returncode == 0
    (project / "geometry" / "render.py").write_text("def draw_square(side):\n    return side * side\n")
    assert run("index", str(project)).returncode == 0
    hits = json.loads(run("search", str(project), "draw_square", "--json").stdout)
    assert hits and hits[0]["symbol"] == "draw_square"
    stale = json.loads(run("search", str(project), "draw_circle", "--json").stdout)
    assert all(h["symbol"] != "draw_circle" for h in stale)


def test_map_lists_signatures_ranked_toward_the_focus(project):
    out = run("map", str(project), "--focus", str(project / "geometry" / "render.py"), "--tokens", "200")
    assert out.returncode == 0, out.stderr
    assert "geometry/shapes.py" in out.stdout
    assert "class Circle" in out.stdout


def test_index_rejects_a_path_that_is_not_a_folder(tmp_path):
    out = run("index", str(tmp_path / "missing"))
    assert out.returncode == 2
    assert "not a folder" in out.stderr


@pytest.mark.skipif(not __import__("context.index.embeddings", fromlist=["x"]).embeddings_available(),
                    reason="the search model is not installed (squidcode setup)")
def test_index_embeds_the_chunks_so_search_finds_a_definition_described_in_other_words(tmp_path):
    root = tmp_path / "stats"
    root.mkdir()
    body = "".join(f"    total = total + {i}\n" for i in range(40))  # each definition its own chunk
    (root / "sampling.py").write_text(
        f'def gauss(mu, sigma):\n    """Gaussian distribution: mu is the mean, sigma the deviation."""\n'
        f"    total = 0\n{body}    return mu + sigma * total\n\n\n"
        f'def pad_left(text, width):\n    """Right-align text in a field of the given width."""\n'
        f"    total = 0\n{body}    return text\n")
    first = run("index", str(root))
    assert first.returncode == 0, first.stderr
    assert "squidcode: embedding for semantic search: done, 2/2 chunks" in first.stderr
    hits = json.loads(run("search", str(root), "draw a normally distributed random number", "-k", "1",
                          "--json").stdout)
    assert [h["symbol"] for h in hits] == ["gauss"]
    again = run("index", str(root))  # nothing new: nothing embedded again
    assert again.returncode == 0 and "embedding" not in again.stderr


def test_index_in_a_workspace_never_runs_its_files_in_the_parse_workers(tmp_path):
    """The parse workers are spawned with `python -c`, which put the working folder first on sys.path:
    run in a workspace holding a `multiprocessing.py`, `squidcode index .` ran it in each worker."""
    root = tmp_path / "ws"
    root.mkdir()
    marker = tmp_path / "ran"
    for name in ("multiprocessing.py", "threading.py"):
        (root / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\nraise SystemExit(7)\n")
    for i in range(200):  # enough files for the worker pool
        (root / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    (root / ".squidcode.toml").write_text("[index]\nembeddings = false\n")  # the parse workers alone
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONSAFEPATH"}
    done = subprocess.run([*CLI, "index", ".", "--json"], cwd=root, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files"] == 203  # the modules, the two baits, the config file
    assert not marker.exists(), marker.read_text()
    assert "worker pool broke" not in done.stderr
