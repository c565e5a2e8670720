"""A throwaway PostgreSQL server for tests: Debian's postgresql package, initialised in a temporary
folder and listening on a free loopback port, stopped and removed afterwards."""

from __future__ import annotations

import contextlib
import glob
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["INITDB", "NO_POSTGRES", "have_postgres", "postgres_server"]

INITDB = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
NO_POSTGRES = "needs a PostgreSQL server (apt-get install -y postgresql)"


def have_postgres() -> bool:
    return bool(INITDB) and shutil.which("runuser") is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yield the URL of a running server (user postgres, trust authentication, loopback only)."""
    bin_dir = Path(INITDB[-1]).parent
    # The server refuses to run as root and needs a folder its own user can reach.
    base = Path(tempfile.mkdtemp(prefix="squidcode-pg-"))
    base.chmod(0o755)
    shutil.chown(base, "postgres", "postgres")
    port = _free_port()

    def as_postgres(*command: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True, timeout=120
        )

    as_postgres(str(bin_dir / "initdb"), "-D", str(base / "data"), "-A", "trust", "-U", "postgres")
    as_postgres(
        str(bin_dir / "pg_ctl"), "-D", str(base / "data"), "-l", str(base / "log"), "-w",
        "-o", f"-p {port} -k {base} -c listen_addresses=127.0.0.1", "start",
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        as_postgres(str(bin_dir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)
