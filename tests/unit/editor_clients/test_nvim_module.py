"""The Neovim plugin's pure helpers (lua/squidcode), evaluated in a headless Neovim, no server."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import REPO
from tests.e2e.test_neovim import find_nvim

CLIENT_DIR = REPO / "editor-clients" / "nvim"

SCRIPT = r"""
vim.opt.runtimepath:prepend(os.getenv('CLIENT_DIR'))
local squid = require('squidcode')
local buf = vim.api.nvim_create_buf(false, true)
vim.api.nvim_buf_set_lines(buf, 0, -1, true, { 'x = 1', 'café 𝄞 = 2', 'z' })
local out = {
  status = squid.describe_status({
    version = '0.1.0',
    model = { name = 'SmolLM2-135M-Instruct', loaded = true, device = 'cpu', dtype = 'float32',
              error = vim.NIL },
    index = { state = 'ready', files = 3, symbols = 7 },
    feedback = { record = true, share = false },
    training = { state = 'off' },
  }),
  failed = squid.describe_status({
    model = { name = '/m', loaded = false, error = 'model.path /m does not exist.' } }),
  loading = squid.describe_status({ model = { name = 'm', loaded = false, error = vim.NIL } }),
  feedback = squid.describe_feedback({ record = true, share = true, storage = 'hashed', endpoint = 'https://t',
                                       episodes = 2, events = 5 }),
  feedback_off = squid.describe_feedback({ record = false, share = false, endpoint = vim.NIL }),
  range16 = squid.line_range(buf, 1, 2, 'utf-16'),
  range8 = squid.line_range(buf, 2, 2, 'utf-8'),
  statusline = squid.statusline(),
  offers = { squid.offers({ server_capabilities = {
                              executeCommandProvider = { commands = { 'squidcode.status' } } } },
                          'squidcode.status'),
             squid.offers({ server_capabilities = {} }, 'squidcode.status') },
}
io.stdout:write(vim.json.encode(out))
"""


def test_nvim_module_helpers(tmp_path):
    script = tmp_path / "helpers.lua"
    script.write_text(SCRIPT, encoding="utf-8")
    run = subprocess.run([find_nvim(), "--headless", "--clean", "-l", str(script)], capture_output=True,
                         text=True, timeout=60, env={"CLIENT_DIR": str(CLIENT_DIR), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["status"] == [
        "squidcode 0.1.0",
        "model: SmolLM2-135M-Instruct (loaded, cpu, float32)",
        "index: ready: 3 files, 7 symbols",
        "feedback: recording, not shared",
        "training: off",
    ]
    assert out["failed"][1] == "model: /m (failed, ?, ?): model.path /m does not exist."
    assert out["failed"][2] == "index: off"
    assert out["loading"][1] == "model: m (loading, ?, ?)"
    assert out["feedback"] == ("squidcode feedback: recording (hashed), sharing with https://t; "
                               "2 episode(s), 5 event(s).")
    assert out["feedback_off"] == "squidcode feedback: not recording, nothing shared."
    # Line 2 is 'café 𝄞 = 2': 11 UTF-16 units (é is 1, 𝄞 is 2), 14 bytes.
    assert out["range16"] == {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 11}}
    assert out["range8"] == {"start": {"line": 1, "character": 0}, "end": {"line": 1, "character": 14}}
    assert out["statusline"] == ""  # no client running
    assert out["offers"] == [True, False]
