"""The project passes its own linter (real ruff, configured in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the test extras: pip install -e '.[test]'"
    out = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
