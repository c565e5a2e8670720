-- End-to-end check: a real headless Neovim, configured by editor-clients/nvim, asks the squidcode
-- server for inline completions.
--
--   nvim --headless --clean -l tests/e2e/nvim/complete.lua
--
-- Environment:
--   SQUIDCODE_TEST_FILE     file to open (required); the file ends with an unfinished function whose
--                           last line is indented and empty: the cursor goes at its end.
--   SQUIDCODE_SERVER_CMD    JSON array overriding the config's `cmd` (default: the config's own)
--   SQUIDCODE_RESULT        where to write the JSON result (default: stdout)
--   SQUIDCODE_CLIENT_DIR    the client folder to put on 'runtimepath' (default: editor-clients/nvim)
--   SQUIDCODE_TIMEOUT_MS    how long to wait for each completion (default: 120000)
--
-- Three inline completions are requested: one on the file as opened, one after edits made through
-- the buffer (lines inserted above, a change in the middle of a line after multibyte characters),
-- and one after those edits are undone. Each edit reaches the server as an incremental didChange,
-- so the last answer matching the first (the model decodes greedily) shows that the server's copy
-- of the buffer tracked Neovim's exactly. Last, Neovim's own vim.lsp.inline_completion (enabled by
-- the plugin file) asks at the same place, draws the ghost text, and accepts it into the buffer.
-- The result is JSON (written to SQUIDCODE_RESULT after each step too, so a killed run still
-- leaves a partial report); the exit status is 0 when the script ran to the end (the test judges
-- the result), 1 when it failed on the way.

local uv = vim.uv or vim.loop

local result = {
  nvim_version = tostring(vim.version()),
  errors = {},
  progress = {},
  messages = {},
  completions = {},
}

local function fail(msg)
  table.insert(result.errors, msg)
end

local function write_result(final)
  local out = os.getenv('SQUIDCODE_RESULT')
  local to_file = out and out ~= ''
  if not (final or to_file) then
    return -- stdout gets the final result only
  end
  local text = vim.json.encode(result)
  if to_file then
    local f = assert(io.open(out, 'w'))
    f:write(text)
    f:close()
  else
    io.stdout:write(text, '\n')
  end
end

local function script_dir()
  local src = debug.getinfo(1, 'S').source:sub(2)
  return vim.fn.fnamemodify(src, ':p:h')
end

local function now_ms()
  return uv.hrtime() / 1e6
end

--- Waits for `cond`, returning true when it held within `ms`.
local function wait_for(ms, cond)
  return vim.wait(ms, cond, 50)
end

local timeout_ms = tonumber(os.getenv('SQUIDCODE_TIMEOUT_MS') or '') or 120000

--- Sends textDocument/inlineCompletion at (line, character), 0-based, and waits for the answer.
local function inline_completion(client, bufnr, label, line, character)
  local entry = { label = label, position = { line = line, character = character } }
  table.insert(result.completions, entry)
  write_result() -- progress so far, in case the test's timeout stops Neovim during the wait
  -- The cursor goes there too, as an editor's would (and the position is where it stays).
  vim.api.nvim_win_set_cursor(0, { line + 1, character })
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = line, character = character },
    context = { triggerKind = 1 }, -- Invoked
  }
  local done, response_err, response = false, nil, nil
  local started = now_ms()
  -- Client:request flushes pending didChange notifications for the buffer first.
  local ok, request_id = client:request('textDocument/inlineCompletion', params, function(err, res)
    response_err, response, done = err, res, true
  end, bufnr)
  if not ok then
    entry.error = 'client:request refused to send the request (client stopped?)'
    return entry
  end
  entry.request_id = request_id
  if not wait_for(timeout_ms, function()
    return done
  end) then
    entry.error = string.format('no response within %d ms', timeout_ms)
    pcall(client.cancel_request, client, request_id)
    return entry
  end
  entry.latency_ms = math.floor(now_ms() - started)
  if response_err then
    entry.error = vim.inspect(response_err)
    return entry
  end
  if response == nil or response == vim.NIL then
    entry.result = 'null'
    entry.items = {}
    return entry
  end
  local items = response.items or response -- InlineCompletionList or InlineCompletionItem[]
  entry.result = response.items and 'InlineCompletionList' or 'InlineCompletionItem[]'
  entry.items = {}
  for _, item in ipairs(items) do
    local text = item.insertText
    if type(text) == 'table' then -- StringValue (snippet)
      text = text.value
    end
    table.insert(entry.items, { insertText = text, range = item.range })
  end
  return entry
end

--- Neovim's own inline completion (enabled by plugin/squidcode.lua): its automatic request, the
--- ghost text it draws from the answer, and vim.lsp.inline_completion.get() accepting it.
---
--- `nvim -l` cannot stay in Insert mode (input is closed, so Insert mode ends at once), so the
--- InsertEnter event that starts the automatic request is fired directly, with the cursor where
--- Insert mode would put it ('virtualedit' lets Normal mode hold it past the last character).
local function builtin_ghost_text(bufnr, line, character)
  local entry = {}
  result.builtin = entry
  write_result()
  if not vim.lsp.inline_completion then
    entry.error = 'this Neovim has no vim.lsp.inline_completion'
    return entry
  end
  entry.enabled = vim.lsp.inline_completion.is_enabled({ bufnr = bufnr })
  local ns = vim.api.nvim_create_namespace('nvim.lsp.inline_completion') -- the module's own
  vim.o.virtualedit = 'onemore'
  vim.api.nvim_win_set_cursor(0, { line + 1, character })
  entry.cursor = vim.api.nvim_win_get_cursor(0)
  local started = now_ms()
  vim.api.nvim_exec_autocmds('InsertEnter', { buffer = bufnr })
  local marks = {}
  local shown = wait_for(timeout_ms, function()
    marks = vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })
    return #marks > 0
  end)
  if not shown then
    entry.error = string.format('no ghost text within %d ms', timeout_ms)
    vim.api.nvim_exec_autocmds('InsertLeave', { buffer = bufnr })
    return entry
  end
  entry.latency_ms = math.floor(now_ms() - started)
  local details = marks[1][4]
  local ghost = {}
  for _, chunk in ipairs(details.virt_text or {}) do
    table.insert(ghost, chunk[1])
  end
  local ghost_lines = { table.concat(ghost) }
  for _, vline in ipairs(details.virt_lines or {}) do
    local parts = {}
    for _, chunk in ipairs(vline) do
      table.insert(parts, chunk[1])
    end
    table.insert(ghost_lines, table.concat(parts))
  end
  entry.ghost_text = table.concat(ghost_lines, '\n')
  entry.ghost_at = { marks[1][2], marks[1][3] }

  local before = vim.api.nvim_buf_line_count(bufnr)
  entry.get_returned = vim.lsp.inline_completion.get()
  -- get() applies the item on the next event-loop turn.
  wait_for(2000, function()
    return #vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, {}) == 0
      and vim.api.nvim_buf_get_lines(bufnr, line, line + 1, true)[1] ~= string.rep(' ', character)
  end)
  local added = vim.api.nvim_buf_line_count(bufnr) - before
  entry.accepted_text = table.concat(vim.api.nvim_buf_get_lines(bufnr, line, line + 1 + added, true), '\n')
  vim.api.nvim_exec_autocmds('InsertLeave', { buffer = bufnr })
  vim.o.virtualedit = ''
  return entry
end

local function main()
  local file = os.getenv('SQUIDCODE_TEST_FILE')
  assert(file and file ~= '', 'SQUIDCODE_TEST_FILE is not set')
  file = vim.fn.fnamemodify(file, ':p')

  -- 1. The real client: editor-clients/nvim on 'runtimepath', its plugin file sourced.
  local client_dir = os.getenv('SQUIDCODE_CLIENT_DIR')
  if not client_dir or client_dir == '' then
    client_dir = vim.fs.normalize(script_dir() .. '/../../../editor-clients/nvim')
  end
  assert(uv.fs_stat(client_dir .. '/lsp/squidcode.lua'), 'no lsp/squidcode.lua under ' .. client_dir)
  vim.opt.runtimepath:prepend(client_dir)
  result.client_dir = client_dir

  -- The test runs the server from its own virtual environment, not `squidcode` on $PATH.
  local overrides = {
    -- Keep the server's user-facing messages in the result instead of printing them.
    handlers = {
      ['window/showMessage'] = function(_, params)
        table.insert(result.messages, params and params.message)
      end,
    },
  }
  local cmd_json = os.getenv('SQUIDCODE_SERVER_CMD')
  if cmd_json and cmd_json ~= '' then
    overrides.cmd = vim.json.decode(cmd_json)
  end
  vim.lsp.config('squidcode', overrides)

  vim.api.nvim_create_autocmd('LspProgress', {
    callback = function(ev)
      local value = ev.data and ev.data.params and ev.data.params.value or {}
      table.insert(result.progress, {
        kind = value.kind,
        title = value.title,
        message = value.message,
      })
    end,
  })

  vim.cmd.runtime('plugin/squidcode.lua')
  local config = vim.lsp.config.squidcode
  result.plugin = {
    loaded = vim.g.loaded_squidcode == true,
    lsp_enabled = vim.lsp.is_enabled and vim.lsp.is_enabled('squidcode') or nil,
    inline_completion_api = vim.lsp.inline_completion ~= nil,
    inline_completion_enabled = vim.lsp.inline_completion ~= nil
      and vim.lsp.inline_completion.is_enabled()
      or false,
    commands = {
      SquidcodeStatus = vim.fn.exists(':SquidcodeStatus') == 2,
      SquidcodeToggle = vim.fn.exists(':SquidcodeToggle') == 2,
    },
    config = config and {
      cmd = config.cmd,
      root_markers = config.root_markers,
      filetypes = config.filetypes,
      has_init_options = config.init_options ~= nil,
    } or vim.NIL,
  }

  -- 2. Open the file: filetype detection fires FileType, and vim.lsp.enable starts the client.
  vim.cmd.edit(vim.fn.fnameescape(file))
  local bufnr = vim.api.nvim_get_current_buf()
  result.filetype = vim.bo[bufnr].filetype

  local client
  local attached = wait_for(60000, function()
    client = vim.lsp.get_clients({ bufnr = bufnr, name = 'squidcode' })[1]
    return client ~= nil and client.initialized == true
  end)
  if not attached then
    local any = vim.lsp.get_clients({ name = 'squidcode' })[1]
    fail(any and 'squidcode client started but did not initialize within 60 s'
      or 'no squidcode client attached to the buffer within 60 s (cmd failed to start?)')
    return
  end
  -- Give the didOpen that follows initialization a moment to go out before the first request.
  wait_for(200, function()
    return false
  end)

  local caps = client.server_capabilities or {}
  local sync = caps.textDocumentSync
  result.client = {
    name = client.name,
    id = client.id,
    root_dir = client.root_dir or vim.NIL,
    offset_encoding = client.offset_encoding,
    cmd = client.config.cmd,
    server_info = client.server_info or vim.NIL,
    attached = vim.lsp.buf_is_attached(bufnr, client.id),
  }
  result.capabilities = {
    inlineCompletionProvider = caps.inlineCompletionProvider ~= nil
      and caps.inlineCompletionProvider ~= false,
    completionProvider = caps.completionProvider ~= nil,
    textDocumentSync_change = type(sync) == 'table' and sync.change or sync,
  }
  local ok_status, status = pcall(vim.api.nvim_exec2, 'SquidcodeStatus', { output = true })
  result.status_command = ok_status and status.output or ('error: ' .. tostring(status))

  -- 3. A completion on the file as opened (this one may wait for the model to load).
  local lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  local n = #lines
  -- The cursor goes at the end of the last line that is indented and otherwise empty.
  local cursor_line
  for i = n, 1, -1 do
    if lines[i]:match('^%s+$') then
      cursor_line = i - 1 -- 0-based
      break
    end
  end
  if not cursor_line then
    fail('found no indented empty line to complete at')
    return
  end
  local cursor_char = #lines[cursor_line + 1]
  local first = inline_completion(client, bufnr, 'opened', cursor_line, cursor_char)

  -- 4. Edits through the buffer, each an incremental textDocument/didChange.
  --    a) two lines inserted at the top (ranges shift every later line by two);
  --    b) text replaced mid-line, after multibyte characters ('é', '☕', '𝄞' are 2, 3 and 4 bytes,
  --       1, 1 and 2 UTF-16 units: the column on the wire depends on the negotiated encoding);
  --    c) a word put into the function's docstring.
  --    (Not with :normal: entering Insert mode would fire vim.lsp.inline_completion's own automatic
  --    request, which would supersede ours on the server.)
  local original = vim.deepcopy(lines)
  vim.api.nvim_buf_set_lines(bufnr, 0, 0, true, {
    '# edited by the squidcode Neovim test: café ☕ 𝄞 done',
    '',
  })
  local edited = vim.api.nvim_buf_get_lines(bufnr, 0, 1, true)[1]
  local s = assert(edited:find('done', 1, true)) - 1 -- byte column, 0-based
  vim.api.nvim_buf_set_text(bufnr, 0, s, 0, s + #'done', { 'finished' })
  local doc_line
  for i = cursor_line + 2, 1, -1 do
    local l = vim.api.nvim_buf_get_lines(bufnr, i - 1, i, true)[1]
    if l:find('"""', 1, true) then
      doc_line = i
      break
    end
  end
  if doc_line then
    local indent = #vim.api.nvim_buf_get_lines(bufnr, doc_line - 1, doc_line, true)[1]:match('^%s*"*')
    vim.api.nvim_buf_set_text(bufnr, doc_line - 1, indent, doc_line - 1, indent, { '(arithmetic) ' })
  end
  result.edited_text_head = vim.api.nvim_buf_get_lines(bufnr, 0, 2, true)
  result.edited_docstring = doc_line and vim.api.nvim_buf_get_lines(bufnr, doc_line - 1, doc_line, true)[1]
    or vim.NIL
  inline_completion(client, bufnr, 'after edits', cursor_line + 2, cursor_char)

  -- 5. Undo the edits (again through the buffer): the text is the original again.
  if doc_line then
    vim.api.nvim_buf_set_lines(bufnr, doc_line - 1, doc_line, true, { original[doc_line - 2] })
  end
  vim.api.nvim_buf_set_text(bufnr, 0, s, 0, s + #'finished', { 'done' })
  vim.api.nvim_buf_set_lines(bufnr, 0, 2, true, {})
  result.restored = table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, true), '\n')
    == table.concat(original, '\n')
  local last = inline_completion(client, bufnr, 'after undoing the edits', cursor_line, cursor_char)
  result.first_equals_last = first.items ~= nil
    and last.items ~= nil
    and vim.deep_equal(first.items, last.items)

  -- 6. The same place through Neovim's own inline-completion machinery.
  builtin_ghost_text(bufnr, cursor_line, cursor_char)

  -- 7. Shut the server down cleanly (shutdown + exit), so no process outlives the test.
  client:stop()
  result.stopped = wait_for(10000, function()
    return client:is_stopped()
  end)
end

local ok, err = xpcall(main, debug.traceback)
if not ok then
  fail('script error: ' .. tostring(err))
end
result.ok = ok and #result.errors == 0
write_result(true)
io.stdout:flush()
os.exit(ok and 0 or 1)
