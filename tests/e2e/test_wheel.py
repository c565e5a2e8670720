"""squidcode installed from its wheel, not run from the source tree: what a user without `./dev` gets.

Builds the sdist and, from it, the wheel (`python -m build --no-isolation`, offline) from a copy of the
source tree; checks the wheel holds every file the packages read at run time; installs it with
`--no-deps` into a fresh venv; and runs the installed `squidcode` from a folder with no source in it:
`setup --dry-run`, `doctor` (the C compiler builds the fused step from the installed source, the
model is found) and one completion (the model loads and generates).

Installing the real dependencies again (torch, transformers: gigabytes) would take longer than the
rest of the suite, so the new venv reads them from this test run's own environment through a `.pth`
file holding that site-packages folder as a plain line. A plain line adds the folder to sys.path
without processing the `.pth` files inside it, so the editable install of squidcode there stays off:
the test checks that `lsp_server` is imported from the new venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

PACKAGES = ("lsp_server", "agent", "context", "feedback", "kernels")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


def _run(command: list, timings: dict, name: str, **kwargs) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    out = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=300, **kwargs)
    timings[name] = round(time.perf_counter() - started, 1)
    assert out.returncode == 0, f"{name}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _copy_source(into: Path) -> set[str]:
    """What a fresh clone holds for the build: pyproject, README and the packages. Returns the
    packages' files (relative paths) that are not Python modules: each must reach the wheel."""
    into.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, into / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, into / package, ignore=_IGNORED)
    return {p.relative_to(into).as_posix() for package in PACKAGES for p in (into / package).rglob("*")
            if p.is_file() and p.suffix != ".py"}


def _venv_with_the_tests_dependencies(venv: Path) -> tuple[Path, Path]:
    """A fresh venv whose sys.path ends with this environment's site-packages: its python and its
    own site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz-squidcode-test-dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    return python, site


def test_the_wheel_installs_and_runs_without_the_source_tree(tmp_path, model_cache_dir):
    timings: dict[str, float] = {}
    expected = _copy_source(tmp_path / "src")

    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp_path / "dist", tmp_path / "src"],
         timings, "build")
    [wheel] = (tmp_path / "dist").glob("squidcode-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert expected <= shipped, f"missing from the wheel: {sorted(expected - shipped)}"
    assert {"kernels/cpu_decode.c", "lsp_server/demo_workspace/inventory.py",
            "lsp_server/demo_agent/names.py", "feedback/train/data/grpo_tasks.json"} <= shipped

    python, installed = _venv_with_the_tests_dependencies(tmp_path / "venv")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "--disable-pip-version-check", "-q", wheel], timings, "install")

    work = tmp_path / "work"  # no source tree here or above
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # The new venv's scripts first; this environment's next, for the tools the dependencies bring (ruff).
    env["PATH"] = os.pathsep.join([str(python.parent), str(Path(sys.executable).parent), env.get("PATH", "")])
    # A private kernel cache: the fused step is compiled from the wheel's own copy of the source.
    env["SQUIDCODE_KERNEL_CACHE"] = str(tmp_path / "kernels")
    env["SQUIDCODE_DATA_DIR"] = str(tmp_path / "data")
    where = _run([python, "-c", "import importlib.util as u; print(*(u.find_spec(p).origin for p in "
                  f"{PACKAGES!r}))"], timings, "find", cwd=work, env=env).stdout.split()
    assert {Path(p).parent.parent for p in where} == {installed}, where  # not the source tree

    squidcode = [python.parent / "squidcode", "--log-level", "warning"]
    setup = _run([*squidcode, "setup", "--dry-run"], timings, "setup", cwd=work, env=env)
    assert "embedded model: already installed" in setup.stdout

    # --no-load: the completion below loads the model; loading it twice would double the test's time.
    doctor = _run([*squidcode, "doctor", "--json", "--no-load"], timings, "doctor", cwd=work, env=env)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["C compiler"]["ok"], checks["C compiler"]
    assert str(tmp_path / "kernels") in checks["C compiler"]["detail"]  # built from the wheel's source
    assert checks["model"]["ok"] and "SmolLM2" in checks["model"]["detail"], checks["model"]

    demo = work / "inventory.py"  # the example the wheel ships, completed where it stops
    shutil.copy(installed / "lsp_server" / "demo_workspace" / "inventory.py", demo)
    lines = demo.read_text().split("\n")
    out = _run([*squidcode, "complete", f"{demo}:{len(lines) - 1}:{len(lines[-2]) + 1}", "--json"],
               timings, "complete", cwd=work, env=env)
    result = json.loads(out.stdout)
    assert result["text"] and result["text"].strip(), result
    assert result["new_tokens"] > 0
    print(f"wheel test timings (s): {timings}")
