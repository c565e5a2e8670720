-- End-to-end check of the Neovim plugin as a user sets it up: require('squidcode').setup({...}), a
-- file opened, the status notification, ghost text accepted through the plugin's accept key (with
-- the acceptance reported), :Squid status / feedback / record, :checkhealth squidcode, and an agent
-- edit on a range applied to the buffer; a next edit previewed and accepted, then one shown as an
-- inline completion with a range and accepted; a rename carried to the file that imports the name.
--
--   nvim --headless --clean -l tests/e2e/nvim/plugin.lua
--
-- Environment: SQUIDCODE_TEST_FILE (the file; it ends on an indented empty line), SQUIDCODE_SETUP
-- (JSON: the options for setup()), SQUIDCODE_RESULT (the JSON report), SQUIDCODE_CLIENT_DIR,
-- SQUIDCODE_TIMEOUT_MS, SQUIDCODE_AGENT_INSTRUCTION, SQUIDCODE_IMPORTER_FILE (a file importing in_stock).
-- The report is rewritten after each step, so a killed run leaves a partial one; the exit status is
-- 0 when the script ran to the end (the test judges the report), 1 when it failed on the way.

local result = { errors = {}, messages = {}, statuslines = {} }
local out = assert(os.getenv('SQUIDCODE_RESULT'), 'SQUIDCODE_RESULT is not set')
local timeout_ms = tonumber(os.getenv('SQUIDCODE_TIMEOUT_MS') or '') or 120000

local function save()
  local f = assert(io.open(out, 'w'))
  f:write(vim.json.encode(result))
  f:close()
end

local function fail(msg)
  table.insert(result.errors, msg)
  save()
end

local function wait_for(ms, cond)
  return vim.wait(ms, cond, 50)
end

local function exec(cmd)
  local ok, res = pcall(vim.api.nvim_exec2, cmd, { output = true })
  return ok and res.output or ('error: ' .. tostring(res))
end

local function lines(bufnr)
  return vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
end

--- setup() as a user calls it; what it registered.
local function setup_plugin()
  vim.opt.runtimepath:prepend(assert(os.getenv('SQUIDCODE_CLIENT_DIR')))
  -- Messages and notifications go into the report instead of the terminal.
  vim.notify = function(msg, level)
    table.insert(result.messages, { msg = msg, level = level })
  end
  local squid = require('squidcode')
  local opts = vim.json.decode(assert(os.getenv('SQUIDCODE_SETUP')))
  squid.setup(opts)
  vim.lsp.config('squidcode', {
    handlers = {
      ['window/showMessage'] = function(_, params)
        table.insert(result.messages, { msg = params and params.message, server = true })
      end,
    },
  })

  local user_commands = vim.api.nvim_get_commands({})
  local map = vim.fn.maparg(opts.accept_key or '<Tab>', 'i', false, true)
  result.setup = {
    lsp_enabled = vim.lsp.is_enabled('squidcode'),
    inline_enabled = vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.is_enabled(),
    squid_desc = user_commands.Squid and user_commands.Squid.definition or vim.NIL,
    squid_range = user_commands.Squid and user_commands.Squid.range or vim.NIL,
    accept_map_desc = map.desc or vim.NIL,
    completions = vim.fn.getcompletion('Squid ', 'cmdline'),
    statusline_before = squid.statusline(),
  }
  save()
  return squid, opts, map
end

--- Opens the file and waits for the client; nil when it did not attach.
local function attach(squid)
  vim.cmd.edit(vim.fn.fnameescape(assert(os.getenv('SQUIDCODE_TEST_FILE'))))
  local bufnr = vim.api.nvim_get_current_buf()
  local client
  if not wait_for(60000, function()
    client = squid.client(bufnr)
    return client ~= nil and client.initialized == true
  end) then
    fail('no squidcode client attached within 60 s')
    return nil
  end
  result.client = { cmd = client.config.cmd, init_options = client.config.init_options,
                    commands = squid.server_commands(client) }
  table.insert(result.statuslines, squid.statusline())
  return client, bufnr
end

--- 1. squidcode/status says the model is loaded; the statusline follows.
local function model_loaded(squid)
  result.model_loaded = wait_for(timeout_ms, function()
    local s = squid.state.status
    return s ~= nil and s.model ~= nil and s.model.loaded == true and squid.state.progress == nil
  end)
  result.status_notification = squid.state.status or vim.NIL
  table.insert(result.statuslines, squid.statusline())
  save()
end

--- 2. Ghost text at the end of the file, accepted through the plugin's accept key mapping.
local function ghost_text_and_accept(squid, client, bufnr, map)
  local n = vim.api.nvim_buf_line_count(bufnr)
  local last = vim.api.nvim_buf_get_lines(bufnr, n - 1, n, true)[1]
  local ns = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')
  vim.o.virtualedit = 'onemore' -- Normal mode may then hold the cursor past the last character
  vim.api.nvim_win_set_cursor(0, { n, #last })
  -- `nvim -l` cannot stay in Insert mode, so the InsertEnter that starts the request is fired directly.
  vim.api.nvim_exec_autocmds('InsertEnter', { buffer = bufnr })
  local marks = {}
  if not wait_for(timeout_ms, function()
    marks = vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })
    return #marks > 0
  end) then
    fail('no ghost text within the timeout')
  else
    local chunks = {}
    for _, chunk in ipairs(marks[1][4].virt_text or {}) do
      table.insert(chunks, chunk[1])
    end
    result.ghost_text = table.concat(chunks)
    -- The mapping's own callback, as pressing the key in Insert mode would run it.
    result.accept_returned = map.callback ~= nil and map.callback() == nil
    wait_for(3000, function()
      return vim.api.nvim_buf_get_lines(bufnr, n - 1, n, true)[1] ~= last
    end)
    result.accepted_line = vim.api.nvim_buf_get_lines(bufnr, n - 1, n, true)[1]
    if squid.offers(client, squid.commands.accept) then
      wait_for(10000, function()
        return #squid.state.accepted > 0 and squid.state.accepted[1].ok ~= nil
      end)
    end
    result.accepted = squid.state.accepted
  end
  vim.api.nvim_exec_autocmds('InsertLeave', { buffer = bufnr })
  vim.o.virtualedit = ''
  save()
end

--- 3. :Squid status, :Squid feedback, :Squid record on, a bad :Squid; 4. :checkhealth squidcode.
local function commands_and_health(squid, bufnr)
  result.status_output = exec('Squid status')
  result.feedback_output = exec('Squid feedback')
  result.record_output = exec('Squid record on')
  result.feedback_state = squid.state.feedback or vim.NIL
  exec('Squid record maybe')
  exec('Squid frobnicate')
  table.insert(result.statuslines, squid.statusline())
  save()

  -- 4. :checkhealth squidcode, read back from its buffer.
  vim.cmd('checkhealth squidcode')
  result.health = table.concat(lines(vim.api.nvim_get_current_buf()), '\n')
  vim.cmd('bwipeout!')
  vim.api.nvim_set_current_buf(bufnr)
  save()
end

--- 6. A next edit: `items` renamed to `stock` in in_stock's signature, typed over as a user would;
--- :Squid next previews the next `items`; :Squid another the one after it; again accepts the first.
local function next_edit(squid, bufnr)
  local row
  for i, line in ipairs(lines(bufnr)) do
    if line:find('^def in_stock%(items') then
      row = i - 1
    end
  end
  if not row then
    return fail('no in_stock line to rename in')
  end
  local col = #'def in_stock('
  vim.api.nvim_buf_set_text(bufnr, row, col, row, col + #'items', { 's' })
  for i, char in ipairs({ 't', 'o', 'c', 'k' }) do
    vim.api.nvim_buf_set_text(bufnr, row, col + i, row, col + i, { char })
    vim.wait(30)
  end
  vim.wait(400) -- the client sends didChange after its debounce
  vim.api.nvim_win_set_cursor(0, { row + 1, col + #'stock' })
  exec('Squid next')
  local shown = squid.state.next_edit
  result.next_edit = shown and shown.edit or vim.NIL
  result.next_edit_marks = #vim.api.nvim_buf_get_extmarks(bufnr, vim.api.nvim_get_namespaces()['squidcode.next_edit'],
    0, -1, {})
  -- Not the one meant: :Squid another waves it off and previews the place after it, then nothing is
  -- left; :Squid next asks afresh and shows the first again, and again accepts it.
  exec('Squid another')
  local another = squid.state.next_edit
  result.another_edit = another and another.edit or vim.NIL
  result.another_marks = #vim.api.nvim_buf_get_extmarks(bufnr, vim.api.nvim_get_namespaces()['squidcode.next_edit'],
    0, -1, {})
  exec('Squid another')
  result.another_left = squid.state.next_edit and squid.state.next_edit.edit or vim.NIL
  exec('Squid next')
  result.next_edit_again = squid.state.next_edit and squid.state.next_edit.edit or vim.NIL
  exec('Squid next')
  result.next_edit_accepted = squid.state.next_edit == nil
  local edit = shown and shown.edit
  result.after_next_edit = edit and lines(bufnr)[edit.range.start.line + 1] or vim.NIL
  result.cursor_after_next_edit = vim.api.nvim_win_get_cursor(0)
  save()
end

--- 7. The next edit on the cursor's line as Neovim's own inline completion shows it: an item with a
--- range that starts before the cursor (the old name), accepted through the plugin's accept key.
local function next_edit_inline(squid, client, bufnr, map)
  local params = { textDocument = { uri = vim.uri_from_bufnr(bufnr) }, position = { line = 0, character = 0 } }
  local response = client:request_sync('squidcode/nextEdit', params, 5000, bufnr)
  local edit = response and response.result and response.result.edits and response.result.edits[1]
  if not edit then
    return fail('no further next edit to show inline')
  end
  local row = edit.range.start.line
  local before = lines(bufnr)[row + 1]
  result.inline_next_edit = { row = row, before = before, edit = edit }
  local ns = vim.api.nvim_create_namespace('nvim.lsp.inline_completion')
  vim.o.virtualedit = 'onemore'
  vim.api.nvim_win_set_cursor(0, { row + 1, #before })
  vim.api.nvim_exec_autocmds('InsertEnter', { buffer = bufnr })
  local marks = {}
  if not wait_for(timeout_ms, function()
    marks = vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })
    return #marks > 0
  end) then
    fail('no inline next edit within the timeout')
  else
    result.inline_next_edit.mark_row = marks[1][2]
    result.inline_next_edit.overlay = marks[1][4].virt_text_pos == 'overlay'
    result.inline_next_edit.accept_returned = map.callback ~= nil and map.callback() == nil
    wait_for(3000, function()
      return lines(bufnr)[row + 1] ~= before
    end)
    result.inline_next_edit.after = lines(bufnr)[row + 1]
  end
  vim.api.nvim_exec_autocmds('InsertLeave', { buffer = bufnr })
  vim.o.virtualedit = ''
  save()
end

local function marks_in(bufnr)
  return #vim.api.nvim_buf_get_extmarks(bufnr, vim.api.nvim_get_namespaces()['squidcode.next_edit'], 0, -1, {})
end

--- 8. A rename carried to another file: in_stock renamed at its def, no use of it left in the file;
--- :Squid next hints at the file that imports it (SQUIDCODE_IMPORTER_FILE), goes there and previews
--- the import, accepts it (reported), then shows and accepts the call below it.
local function next_edit_elsewhere(squid, bufnr)
  vim.api.nvim_set_current_buf(bufnr)
  local row
  for i, line in ipairs(lines(bufnr)) do
    if line:find('^def in_stock%(') then
      row = i - 1
    end
  end
  if not row then
    return fail('no in_stock def to rename')
  end
  local accepted_before = #squid.state.accepted
  vim.api.nvim_buf_set_text(bufnr, row, 4, row, 4 + #'in_stock', { 'available' })
  vim.wait(400) -- the client sends didChange after its debounce
  vim.api.nvim_win_set_cursor(0, { row + 1, 4 + #'available' })
  exec('Squid next')
  local shown = squid.state.next_edit
  result.elsewhere = { target = shown and shown.target or vim.NIL, edit = shown and shown.edit or vim.NIL,
                       hint_marks = marks_in(bufnr) }
  exec('Squid next') -- goes there
  local other = vim.api.nvim_get_current_buf()
  result.elsewhere.went = vim.fs.basename(vim.api.nvim_buf_get_name(other))
  result.elsewhere.cursor = vim.api.nvim_win_get_cursor(0)
  result.elsewhere.preview_marks = marks_in(other)
  result.elsewhere.attached = wait_for(30000, function()
    return squid.client(other) ~= nil
  end)
  exec('Squid next') -- accepts
  result.elsewhere.after_import = lines(other)[1]
  vim.wait(400)
  exec('Squid next') -- the call below, in that file
  result.elsewhere.call = squid.state.next_edit and squid.state.next_edit.edit or vim.NIL
  exec('Squid next')
  result.elsewhere.after = lines(other)
  wait_for(10000, function()
    local last = squid.state.accepted[#squid.state.accepted]
    return #squid.state.accepted >= accepted_before + 2 and last.ok ~= nil
  end)
  result.elsewhere.reported = vim.list_slice(squid.state.accepted, accepted_before + 1)
  vim.api.nvim_set_current_buf(bufnr)
  save()
end

--- 5. The agent on line 1 (a range), its WorkspaceEdit applied to the buffer.
local function agent_on_a_range(squid, client, bufnr)
  result.before_agent = lines(bufnr)
  local instruction = os.getenv('SQUIDCODE_AGENT_INSTRUCTION') or 'make the module docstring say what the module holds'
  result.agent_output = exec('1,1Squid agent ' .. instruction)
  if squid.offers(client, squid.commands.agent) then
    wait_for(240000, function()
      return squid.state.agent ~= nil and not squid.state.agent.running
    end)
    result.agent = squid.state.agent or vim.NIL
    result.after_agent = lines(bufnr)
  end
  save()
end

local function main()
  local squid, _, map = setup_plugin()
  local client, bufnr = attach(squid)
  if not client then
    return
  end
  model_loaded(squid)
  ghost_text_and_accept(squid, client, bufnr, map)
  commands_and_health(squid, bufnr)
  next_edit(squid, bufnr)
  next_edit_inline(squid, client, bufnr, map)
  agent_on_a_range(squid, client, bufnr)
  next_edit_elsewhere(squid, bufnr)
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
save()
os.exit(ok and 0 or 1)
