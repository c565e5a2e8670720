-- squidcode for Neovim: enables the `squidcode` LSP config and inline completion (ghost text), and
-- defines :Squid (agent, status, feedback, record). `require('squidcode').setup({...})` configures
-- it (command, settings, accept key); see lua/squidcode/init.lua.
-- Opt out before this file runs with `vim.g.squidcode_enabled = false` (the commands stay
-- available), or keep the server but not ghost text with `vim.g.squidcode_inline = false`.

if vim.g.loaded_squidcode then
  return
end
vim.g.loaded_squidcode = true

if vim.fn.has('nvim-0.11') == 0 then
  vim.notify('squidcode: needs Neovim 0.11 or newer', vim.log.levels.WARN)
  return
end

require('squidcode').register()

local function clients(bufnr)
  return vim.lsp.get_clients({ name = 'squidcode', bufnr = bufnr })
end

if vim.g.squidcode_enabled ~= false then
  vim.lsp.enable('squidcode')
  -- Inline completion (LSP 3.18) is built into Neovim 0.12; on 0.11 only the server runs.
  if vim.g.squidcode_inline ~= false and vim.lsp.inline_completion then
    vim.lsp.inline_completion.enable()
  end
end

vim.api.nvim_create_user_command('SquidcodeStatus', function()
  local all = clients()
  if #all == 0 then
    print('squidcode: no client running (is `squidcode` on $PATH, and the filetype listed?)')
    return
  end
  local here = {}
  for _, c in ipairs(clients(0)) do
    here[c.id] = true
  end
  local lines = {}
  for _, c in ipairs(all) do
    local caps = c.server_capabilities or {}
    lines[#lines + 1] = string.format(
      'squidcode: client %d, root %s, %s this buffer, inline completion %s%s',
      c.id,
      c.root_dir or '(single file)',
      here[c.id] and 'attached to' or 'not attached to',
      caps.inlineCompletionProvider and 'advertised' or 'not advertised',
      vim.lsp.inline_completion
          and (vim.lsp.inline_completion.is_enabled() and ', ghost text on' or ', ghost text off')
        or ''
    )
  end
  print(table.concat(lines, '\n'))
end, { desc = 'Show the squidcode language server client and its inline-completion state' })

vim.api.nvim_create_user_command('SquidcodeToggle', function()
  if not vim.lsp.inline_completion then
    vim.notify('squidcode: inline completion needs Neovim 0.12', vim.log.levels.WARN)
    return
  end
  local on = not vim.lsp.inline_completion.is_enabled()
  vim.lsp.inline_completion.enable(on)
  print('squidcode: ghost text ' .. (on and 'on' or 'off'))
end, { desc = 'Toggle squidcode inline completion (ghost text)' })
