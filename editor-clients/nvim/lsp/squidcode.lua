-- squidcode: AI inline completions from a small local model, served over LSP.
--
-- Picked up by `vim.lsp.enable('squidcode')` (Neovim 0.11+) when this folder is on 'runtimepath'
-- or this file is copied into a `lsp/` folder of your config. Override any field with
-- `vim.lsp.config('squidcode', { ... })`, e.g. `cmd = { '/path/to/venv/bin/squidcode', 'serve' }`.

---@type vim.lsp.Config
return {
  cmd = { 'squidcode', 'serve' },
  filetypes = {
    'c', 'cpp', 'cs', 'css', 'go', 'html', 'java', 'javascript', 'javascriptreact', 'json',
    'kotlin', 'lua', 'markdown', 'php', 'python', 'ruby', 'rust', 'scss', 'sh', 'sql', 'swift',
    'toml', 'typescript', 'typescriptreact', 'vim', 'yaml', 'zig', 'zsh',
  },
  root_markers = { '.git', '.squidcode.toml' },
  -- Server settings (the same keys as `.squidcode.toml`, e.g. `{ completion = { max_tokens = 48 } }`)
  -- go here or in `settings = { squidcode = { ... } }`. vim.empty_dict(), not {}: an empty Lua
  -- table goes out as a JSON array (older servers rejected it as settings).
  init_options = vim.empty_dict(),
}
