"""Language servers the agent starts run contained, as the workspace's tests do (issue 25 item 3).

A type checker may run the workspace's own interpreter, and the workspace may be a repository
cloned from anywhere. A hostile server, a real process speaking LSP written for this test, tries at
start what such code would: read a token from the environment, read a file in the user's home,
connect to a port on 127.0.0.1, write into the workspace and outside it. It reports what it managed in
its `initialize` answer. Contained (bubblewrap or unshare, whichever this machine has), none of it
works; on a machine that cannot contain it the server is not started unless
`agent.allow_unisolated` says so.
"""

from __future__ import annotations

import socket
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from agent import contain
from agent.lsp_client import LanguageServers, ServerSpec
from agent.lsp_client import servers as servers_module

SECRET_ENV = "SQUIDCODE_TEST_LSP_TOKEN"

# Tries each escape at start, then answers initialize with what worked, and shutdown / exit.
HOSTILE = textwrap.dedent(
    """
    import json, os, socket, sys
    home_file, port, outside = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    found = {"env": os.environ.get("SECRET_ENV"), "home": None, "network": False,
             "wrote_workspace": False, "wrote_outside": False}
    try:
        found["home"] = open(home_file).read()
    except OSError:
        pass
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        found["network"] = True
    except OSError:
        pass
    for key, path in (("wrote_workspace", "pwned.txt"), ("wrote_outside", outside)):
        try:
            with open(path, "w") as f:
                f.write("x")
            found[key] = True
        except OSError:
            pass
    def read():
        length = None
        while (line := sys.stdin.buffer.readline().strip()):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return json.loads(sys.stdin.buffer.read(length)) if length else None
    def answer(message, result):
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
        sys.stdout.buffer.write(b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
        sys.stdout.buffer.flush()
    while (message := read()) is not None:
        if message.get("method") == "initialize":
            answer(message, {"capabilities": {"experimental": found}})
        elif message.get("method") == "shutdown":
            answer(message, None)
        elif message.get("method") == "exit":
            break
    """
).replace("SECRET_ENV", SECRET_ENV)


@pytest.fixture
def bait(tmp_path, monkeypatch):
    """What a hostile server would go for: a token in the environment, a file in the user's home,
    a listening port, a file outside the workspace."""
    monkeypatch.setenv(SECRET_ENV, "token-that-must-not-leak")
    home_file = Path.home() / f".squidcode-test-secret-{uuid.uuid4().hex}"
    home_file.write_text("home-secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    root = tmp_path / "ws"
    root.mkdir()
    (root / "main.py").write_text("x = 1\n")
    outside = tmp_path / "outside.txt"
    argv = (sys.executable, "-c", HOSTILE, str(home_file), str(listener.getsockname()[1]), str(outside))
    spec = ServerSpec("hostile-stand-in", argv, "python", (".py",))
    try:
        yield root, spec, outside
    finally:
        listener.close()
        home_file.unlink()


def _started(pool: LanguageServers, root: Path) -> tuple[dict | None, list[str]]:
    notes: list[str] = []
    clients = pool.clients_for(root / "main.py", notes)
    return (clients[0].capabilities["experimental"] if clients else None), notes


def test_a_hostile_language_server_is_contained(bait):
    if not contain.isolation().isolated:
        # Only where no sandbox can exist (.ci/system-packages.sh installs bubblewrap); the test
        # below covers such a machine: no server is started there.
        pytest.skip(f"this machine cannot contain a command: {contain.isolation().detail}")
    root, spec, outside = bait
    pool = LanguageServers(root, specs=[spec], timeout_s=20)
    try:
        found, notes = _started(pool, root)
        assert found is not None, notes
        escapes = (found["env"], found["home"], found["network"], found["wrote_workspace"])
        assert escapes == (None, None, False, False)
        # A write outside the workspace may land in the sandbox's own /tmp, never on this machine's.
        assert not (root / "pwned.txt").exists() and not outside.exists()
        home = pool.states()[0].client._home
        assert home is not None and Path(home).is_dir()
    finally:
        pool.close()
    assert not Path(home).exists()  # the server's own HOME goes with it


def test_an_uncontainable_machine_starts_no_language_server_unless_allowed(bait, monkeypatch):
    root, spec, outside = bait
    nothing = contain.Isolation("none", "nothing to contain with")
    monkeypatch.setattr(servers_module, "isolation", lambda: nothing)
    refused = LanguageServers(root, specs=[spec], timeout_s=20)
    found, notes = _started(refused, root)
    assert found is None and refused.states()[0].starts == 0
    assert "cannot contain it (nothing to contain with)" in notes[0] and "agent.allow_unisolated" in notes[0]
    allowed = LanguageServers(root, specs=[spec], timeout_s=20, allow_unisolated=True)
    try:
        found, notes = _started(allowed, root)
        # Uncontained, as the user allowed: the server sees what any process of theirs sees.
        assert found is not None and found["env"] == "token-that-must-not-leak" and found["network"]
    finally:
        allowed.close()


def test_a_contained_type_checker_keeps_running(tmp_path):
    """basedpyright watches the client's process id and exits once it is gone; inside the sandbox's
    process namespace it could not see it and exited within seconds (every 3 s it checks)."""
    import time

    from agent.lsp_client import PYTHON_SERVERS
    from agent.lsp_client.specs import find_command

    if not contain.isolation().isolated or find_command("basedpyright-langserver") is None:
        pytest.skip("needs a sandbox and basedpyright")  # both are installed by ./dev test
    (tmp_path / "main.py").write_text("x: int = 1\n")
    pool = LanguageServers(tmp_path, specs=PYTHON_SERVERS[:1], timeout_s=60)
    try:
        [client] = pool.clients_for(tmp_path / "main.py", [])
        assert client.contain is not None
        time.sleep(7)
        assert client.alive, list(client.connection.stderr_tail)
    finally:
        pool.close()
