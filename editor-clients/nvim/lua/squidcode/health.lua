-- :checkhealth squidcode: Neovim, the server command and its version, the running client, the
-- model and the index (from squidcode.status).

local M = {}

local health = vim.health

local function server_cmd()
  local config = vim.lsp.config.squidcode or {}
  local cmd = config.cmd
  return type(cmd) == 'table' and cmd or nil
end

--- `squidcode --version` for the configured command (its trailing `serve` swapped for `--version`).
local function server_version(cmd)
  local argv = vim.deepcopy(cmd)
  if argv[#argv] == 'serve' then
    argv[#argv] = '--version'
  else
    table.insert(argv, '--version')
  end
  local ok, run = pcall(vim.system, argv, { text = true })
  if not ok then
    return nil, tostring(run)
  end
  local done = run:wait(20000)
  if done.code ~= 0 then
    return nil, vim.trim((done.stderr or '') .. (done.stdout or ''))
  end
  return vim.trim(done.stdout or '')
end

local function check_neovim()
  if vim.fn.has('nvim-0.11') == 1 then
    health.ok('Neovim ' .. tostring(vim.version()))
  else
    health.error('Neovim 0.11 or newer is needed (vim.lsp.config)')
  end
  if vim.lsp.inline_completion then
    health.ok('inline completion (ghost text) available')
  else
    health.warn('no vim.lsp.inline_completion: ghost text needs Neovim 0.12', { 'Completion still works via textDocument/completion' })
  end
end

local function check_server()
  local cmd = server_cmd()
  if not cmd then
    return health.error('no `squidcode` LSP config (is editor-clients/nvim on the runtimepath?)')
  end
  if vim.fn.executable(cmd[1]) ~= 1 then
    return health.error(('server command not found: %s'):format(cmd[1]), {
      "Set it: require('squidcode').setup({ cmd = { '/path/to/squidcode/.venv/bin/squidcode', 'serve' } })",
    })
  end
  health.ok(('server command: %s'):format(table.concat(cmd, ' ')))
  local version, err = server_version(cmd)
  if version then
    health.ok('server version: ' .. version)
  else
    health.error('the server command does not run: ' .. tostring(err))
  end
end

local function check_running()
  local squid = require('squidcode')
  local client = squid.client()
  if not client then
    return health.warn('no squidcode client running', { 'Open a file of a listed filetype; it starts on its own' })
  end
  health.ok(('client %d running (root %s), attached to %d buffer(s)'):format(client.id,
    client.root_dir or 'single file', vim.tbl_count(client.attached_buffers or {})))
  if not squid.offers(client, squid.commands.status) then
    return health.warn('this server does not offer squidcode.status (an older squidcode?)')
  end
  local status, err = squid.request_sync(squid.commands.status, {}, nil, 5000)
  if not status then
    return health.error('squidcode.status failed: ' .. tostring(err))
  end
  local lines = squid.describe_status(status)
  local model = status.model or {}
  if model.error and model.error ~= vim.NIL then
    health.error(lines[2], { 'Run `squidcode doctor` in a terminal for details' })
  elseif model.loaded then
    health.ok(lines[2])
  else
    health.info(lines[2])
  end
  local index = status.index or {}
  if index.error and index.error ~= vim.NIL then
    health.warn(lines[3] .. ': ' .. tostring(index.error))
  else
    health.ok(lines[3])
  end
  health.info(lines[4])
  health.info('server commands: ' .. table.concat(squid.server_commands(client), ', '))
end

function M.check()
  health.start('squidcode: Neovim')
  check_neovim()
  health.start('squidcode: server')
  check_server()
  health.start('squidcode: running client')
  check_running()
end

return M
