-- squidcode for Neovim: setup(), the :Squid command, acceptance reporting, a statusline helper.
--
--   require('squidcode').setup({
--     cmd = { '/path/to/squidcode/.venv/bin/squidcode', 'serve' },   -- default: squidcode on $PATH
--     settings = { completion = { max_tokens = 48 } },               -- server settings (.squidcode.toml keys)
--     backend_url = 'http://127.0.0.1:8000/v1',                      -- an OpenAI-compatible server for the agent
--     accept_key = '<Tab>',                                          -- false: map nothing
--     inline = true,                                                 -- ghost text (Neovim 0.12+)
--   })
--
-- Everything smart happens in the server; this file only calls the commands of docs/protocol.md.

local M = {}

M.name = 'squidcode'

M.commands = {
  status = 'squidcode.status',
  agent = 'squidcode.agent.run',
  agent_applied = 'squidcode.agent.applied',
  accept = 'squidcode.completion.accept',
  feedback_status = 'squidcode.feedback.status',
  set_record = 'squidcode.feedback.setRecord',
  set_share = 'squidcode.feedback.setShare',
}

--- What the plugin knows, for the statusline and for scripts (and tests): the last `squidcode/status`
--- and `squidcode/indexStatus`, $/progress, the last agent result, acceptances reported.
M.state = {
  status = nil,
  index = nil,
  progress = nil, -- { title, message, percentage } while a server task runs
  agent = nil, -- { running = bool, result = table?, error = string?, applied = bool? }
  accepted = {}, -- one entry per acceptance reported: { args, ok, error }
  feedback = nil, -- the last feedback status
  next_edit = nil, -- the next edit shown: { bufnr, edit, encoding, client_id, target? (another file's URI) }
}

local registered = false

--- The running squidcode client for `bufnr` (any buffer when nil).
function M.client(bufnr)
  return vim.lsp.get_clients({ name = M.name, bufnr = bufnr })[1]
end

--- The commands the server lists in executeCommandProvider.
function M.server_commands(client)
  local provider = client and client.server_capabilities and client.server_capabilities.executeCommandProvider
  return type(provider) == 'table' and provider.commands or {}
end

function M.offers(client, command)
  return vim.list_contains(M.server_commands(client), command)
end

local function notify(msg, level)
  vim.notify('squidcode: ' .. msg, level or vim.log.levels.INFO)
end

--- The client that offers `command`, or nil after telling the user why not.
local function client_for(command, bufnr)
  local client = M.client(bufnr) or M.client()
  if not client then
    notify('no server running (open a file of a listed filetype; see :checkhealth squidcode)', vim.log.levels.ERROR)
    return nil
  end
  if not M.offers(client, command) then
    notify(('this server does not offer %s: update squidcode'):format(command), vim.log.levels.ERROR)
    return nil
  end
  return client
end

--- Runs a server command synchronously (for the quick ones: status, feedback). Returns result, err.
function M.request_sync(command, args, bufnr, timeout_ms)
  local client = client_for(command, bufnr)
  if not client then
    return nil, 'unavailable'
  end
  local response, err = client:request_sync('workspace/executeCommand', {
    command = command,
    arguments = { args or vim.empty_dict() },
  }, timeout_ms or 10000, bufnr or 0)
  if not response then
    return nil, err or 'no answer'
  end
  if response.err then
    return nil, response.err.message or vim.inspect(response.err)
  end
  return response.result
end

-- -- status -------------------------------------------------------------------------------------

local function short_name(name)
  name = (name or 'model'):gsub('[/\\]+$', '')
  return name:match('[^/\\]+$') or name
end

--- A short text for the statusline: what the server is doing, or '' when no client runs.
--- `set statusline+=%{v:lua.require'squidcode'.statusline()}`
function M.statusline()
  if not M.client() then
    return ''
  end
  local s, p = M.state, M.state.progress
  if s.agent and s.agent.running then
    return 'squid: agent…'
  end
  if p then
    local pct = p.percentage and (' ' .. p.percentage .. '%') or ''
    return ('squid: %s%s'):format((p.title or ''):gsub('^squidcode: ', ''):lower(), pct)
  end
  local model = s.status and s.status.model or {}
  if model.error and model.error ~= vim.NIL then
    return 'squid: model failed'
  end
  if not model.loaded then
    return 'squid: loading model'
  end
  local training = s.status.training or {}
  if training.state and training.state ~= 'off' and training.state ~= 'idle' then
    return ('squid: training %s'):format(training.step ~= vim.NIL and training.step or '')
  end
  return 'squid: ' .. short_name(model.name)
end

--- Lines describing a `squidcode.status` object.
function M.describe_status(status)
  local model = status.model or {}
  local index = status.index or {}
  local feedback = status.feedback or {}
  local training = status.training or {}
  local err = model.error ~= vim.NIL and model.error or nil
  local lines = {
    ('squidcode %s'):format(status.version or '?'),
    ('model: %s (%s, %s, %s)%s'):format(model.name or '?', model.loaded and 'loaded' or (err and 'failed' or 'loading'),
      model.device or '?', model.dtype or '?', err and (': ' .. err) or ''),
    ('index: %s%s'):format(index.state or 'off',
      index.files and (': %d files, %d symbols'):format(index.files, index.symbols or 0) or ''),
    ('feedback: %s, %s'):format(feedback.record and 'recording' or 'not recording',
      feedback.share and 'sharing' or 'not shared'),
    ('training: %s'):format(training.state or 'off'),
  }
  return lines
end

function M.show_status()
  local status, err = M.request_sync(M.commands.status, {})
  if not status then
    return notify('status: ' .. tostring(err), vim.log.levels.ERROR)
  end
  M.state.status = status
  print(table.concat(M.describe_status(status), '\n'))
  return status
end

-- -- feedback -----------------------------------------------------------------------------------

function M.describe_feedback(f)
  local record = f.record and ('recording (%s)'):format(f.storage or 'full') or 'not recording'
  local share = f.share and ('sharing with %s'):format(f.endpoint ~= vim.NIL and f.endpoint or 'the team endpoint')
    or 'nothing shared'
  -- Counts are null (vim.NIL) while the store is not yet readable.
  local episodes = f.episodes ~= vim.NIL and f.episodes or nil
  local events = f.events ~= vim.NIL and f.events or 0
  local counts = episodes and ('; %d episode(s), %d event(s)'):format(episodes, events) or ''
  return ('squidcode feedback: %s, %s%s.'):format(record, share, counts)
end

local function feedback_command(command, args)
  local result, err = M.request_sync(command, args)
  if not result then
    return notify('feedback: ' .. tostring(err), vim.log.levels.ERROR)
  end
  M.state.feedback = result
  print(M.describe_feedback(result))
  return result
end

function M.feedback()
  return feedback_command(M.commands.feedback_status, {})
end

function M.record(on)
  return feedback_command(M.commands.set_record, { on = on })
end

function M.share(on)
  return feedback_command(M.commands.set_share, { on = on })
end

-- -- agent --------------------------------------------------------------------------------------

--- The LSP range of lines `line1`..`line2` (1-based, inclusive) of `bufnr`.
function M.line_range(bufnr, line1, line2, offset_encoding)
  local last = vim.api.nvim_buf_get_lines(bufnr, line2 - 1, line2, true)[1] or ''
  return {
    start = { line = line1 - 1, character = 0 },
    ['end'] = { line = line2 - 1, character = vim.str_utfindex(last, offset_encoding or 'utf-16') },
  }
end

--- Asks the agent to do `instruction` on lines line1..line2 of the current buffer (the whole file
--- when no range is given) and applies the edit it returns. Asynchronous; `M.state.agent` follows it.
function M.agent(instruction, line1, line2)
  instruction = vim.trim(instruction or '')
  if instruction == '' then
    return notify('say what the agent should do: :Squid agent {instruction}', vim.log.levels.ERROR)
  end
  local bufnr = vim.api.nvim_get_current_buf()
  local client = client_for(M.commands.agent, bufnr)
  if not client then
    return
  end
  local args = { instruction = instruction, uri = vim.uri_from_bufnr(bufnr) }
  if line1 and line2 then
    args.range = M.line_range(bufnr, line1, line2, client.offset_encoding)
  end
  M.state.agent = { running = true, args = args }
  notify('agent: working on "' .. instruction .. '"…')
  client:request('workspace/executeCommand', { command = M.commands.agent, arguments = { args } }, function(err, result)
    local entry = { running = false, args = args, result = result }
    M.state.agent = entry
    if err then
      entry.error = err.message or vim.inspect(err)
      return notify('agent: ' .. entry.error, vim.log.levels.ERROR)
    end
    if type(result) ~= 'table' or not result.edit or result.edit == vim.NIL then
      return notify('agent: no edit proposed', vim.log.levels.WARN)
    end
    vim.lsp.util.apply_workspace_edit(result.edit, client.offset_encoding)
    entry.applied = true
    if type(result.episodeId) == 'string' then
      -- The server follows the edit from here on (kept, rewritten or reverted).
      client:request('workspace/executeCommand',
        { command = M.commands.agent_applied, arguments = { { episodeId = result.episodeId } } },
        function() end, bufnr)
    end
    notify(('agent: edit applied (%d step(s)); undo with u'):format(#(result.steps or {})))
  end, bufnr)
end

-- -- inline completion ----------------------------------------------------------------------------

--- Accepts the shown inline completion; false when there is none (so a mapping can fall back).
--- The server's accept command attached to the item is run by Neovim after the text goes in.
function M.accept()
  if not vim.lsp.inline_completion then
    return false
  end
  return vim.lsp.inline_completion.get()
end

-- Neovim runs an item's command through vim.lsp.commands first: this forwards the acceptance to the
-- server, records it, and stays quiet with a server that does not offer it.
local function report_acceptance(command, ctx)
  local client = vim.lsp.get_client_by_id(ctx.client_id)
  local entry = { args = command.arguments and command.arguments[1] }
  table.insert(M.state.accepted, entry)
  if not client or not M.offers(client, M.commands.accept) then
    entry.ok, entry.error = false, 'not offered by the server'
    return
  end
  client:request('workspace/executeCommand', { command = command.command, arguments = command.arguments },
    function(err)
      entry.ok = err == nil
      entry.error = err and (err.message or vim.inspect(err)) or nil
    end, ctx.bufnr)
end

-- -- next edit ------------------------------------------------------------------------------------

local next_ns = vim.api.nvim_create_namespace('squidcode.next_edit')

--- Removes the next-edit preview of `bufnr` (the current buffer by default).
function M.clear_next_edit(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, next_ns, 0, -1)
  end
  if M.state.next_edit and M.state.next_edit.bufnr == bufnr then
    M.state.next_edit = nil
  end
end

local function byte_col(bufnr, position, encoding)
  local line = vim.api.nvim_buf_get_lines(bufnr, position.line, position.line + 1, false)[1] or ''
  return vim.str_byteindex(line, encoding, position.character, false)
end

--- The URI of the file `edit` is in when that is not `bufnr`'s (a rename carried on to a file that
--- imports the name); nil for an edit in `bufnr`.
local function other_file(bufnr, edit)
  local uri = edit.textDocument and edit.textDocument.uri
  if type(uri) ~= 'string' or uri == vim.uri_from_bufnr(bufnr) then
    return nil
  end
  local function real(path)
    return vim.fs.normalize(vim.uv.fs_realpath(path) or path)
  end
  return real(vim.uri_to_fname(uri)) ~= real(vim.api.nvim_buf_get_name(bufnr)) and uri or nil
end

--- Previews `edit` in `bufnr`: the text it replaces struck through, the new text beside it.
local function preview(bufnr, edit, encoding)
  local first, last = edit.range.start, edit.range['end']
  vim.api.nvim_buf_set_extmark(bufnr, next_ns, first.line, byte_col(bufnr, first, encoding), {
    end_row = last.line, end_col = byte_col(bufnr, last, encoding), hl_group = 'DiffDelete',
    virt_text = { { edit.newText, 'DiffAdd' } }, virt_text_pos = 'inline',
  })
end

--- Asks the server for the edit the user is about to make (squidcode/nextEdit, from the edits just
--- made) and previews it: the text it replaces struck through, the new text beside it; an edit in
--- another file is a hint at the end of the cursor's line (the next :Squid next goes there). Returns
--- the edit, or nil when there is none. `dismissed`: places shown before and waved off (LSP
--- Locations); the server answers with the place after them.
function M.next_edit(bufnr, dismissed)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  M.clear_next_edit(bufnr)
  local client = M.client(bufnr)
  if not client then
    return nil
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.textDocument.version = vim.lsp.util.buf_versions[bufnr]
  params.dismissed = dismissed
  local response = client:request_sync('squidcode/nextEdit', params, 2000, bufnr)
  local edit = response and response.result and response.result.edits and response.result.edits[1]
  if not edit then
    return nil
  end
  local target = other_file(bufnr, edit)
  if target then
    local row = vim.api.nvim_win_get_cursor(0)[1] - 1
    local hint = ('  ⇥ %s:%d: %s (:Squid next to go there)'):format(
      vim.fs.basename(vim.uri_to_fname(target)), edit.range.start.line + 1, edit.newText)
    vim.api.nvim_buf_set_extmark(bufnr, next_ns, row, 0, { virt_text = { { hint, 'Comment' } }, virt_text_pos = 'eol' })
  else
    preview(bufnr, edit, client.offset_encoding)
  end
  M.state.next_edit = { bufnr = bufnr, edit = edit, encoding = client.offset_encoding, client_id = client.id,
                        target = target }
  return edit
end

--- Waves off the previewed next edit and previews the one after it (the places waved off at this
--- version of the buffer all stay off); with none previewed, the same as M.next_edit. Returns the
--- edit, or nil when no other is left.
function M.another_next_edit()
  local bufnr = vim.api.nvim_get_current_buf()
  local shown = M.state.next_edit
  if not shown or shown.bufnr ~= bufnr then
    return M.next_edit(bufnr)
  end
  local version = vim.lsp.util.buf_versions[bufnr]
  local waved = M.state.waved
  if not waved or waved.bufnr ~= bufnr or waved.version ~= version then
    waved = { bufnr = bufnr, version = version, places = {} }
    M.state.waved = waved
  end
  local uri = shown.target or (shown.edit.textDocument or {}).uri or vim.uri_from_bufnr(bufnr)
  table.insert(waved.places, { uri = uri, range = shown.edit.range })
  local edit = M.next_edit(bufnr, waved.places)
  if not edit then
    notify('next edit: no other place')
  end
  return edit
end

--- Opens the file of the hinted next edit (another file's), puts the cursor at the edit and previews
--- it there; false when none is hinted or the file changed since the edit was found.
function M.goto_next_edit()
  local shown = M.state.next_edit
  if not shown or not shown.target then
    return false
  end
  M.clear_next_edit(shown.bufnr)
  vim.cmd.edit(vim.fn.fnameescape(vim.uri_to_fname(shown.target)))
  local bufnr = vim.api.nvim_get_current_buf()
  local edit = shown.edit
  local version = edit.textDocument.version
  if type(version) == 'number' and vim.lsp.util.buf_versions[bufnr] ~= version then
    notify('next edit: ' .. vim.fs.basename(vim.api.nvim_buf_get_name(bufnr)) .. ' changed since', vim.log.levels.WARN)
    return false
  end
  preview(bufnr, edit, shown.encoding)
  vim.api.nvim_win_set_cursor(0, { edit.range.start.line + 1, byte_col(bufnr, edit.range.start, shown.encoding) })
  M.state.next_edit = { bufnr = bufnr, edit = edit, encoding = shown.encoding, client_id = shown.client_id }
  return true
end

--- Applies the previewed next edit, puts the cursor after it and reports the acceptance to the
--- server (its command, as for an inline completion); false when none is shown.
function M.accept_next_edit()
  local shown = M.state.next_edit
  if not shown or not vim.api.nvim_buf_is_valid(shown.bufnr) then
    return false
  end
  if shown.target then
    return M.goto_next_edit()
  end
  M.clear_next_edit(shown.bufnr)
  local edit = shown.edit
  vim.lsp.util.apply_text_edits({ { range = edit.range, newText = edit.newText } }, shown.bufnr, shown.encoding)
  local start = edit.range.start
  local col = byte_col(shown.bufnr, start, shown.encoding) + #edit.newText
  if vim.api.nvim_get_current_buf() == shown.bufnr then
    vim.api.nvim_win_set_cursor(0, { start.line + 1, col })
  end
  if type(edit.command) == 'table' and edit.command.command == M.commands.accept then
    -- The client that answered (attached to the other file by now, or the server follows it later).
    report_acceptance(edit.command, { client_id = shown.client_id, bufnr = shown.bufnr })
  end
  return true
end

--- Shows the next edit, or accepts the one shown (goes to it first when it is in another file) (the
--- `next_edit_key` mapping and `:Squid next`).
function M.next()
  if M.state.next_edit and M.state.next_edit.bufnr == vim.api.nvim_get_current_buf() then
    return M.accept_next_edit()
  end
  return M.next_edit() ~= nil
end

-- -- registration ---------------------------------------------------------------------------------

local subcommands = {
  agent = {
    run = function(opts, rest)
      if opts.range > 0 then
        M.agent(rest, opts.line1, opts.line2)
      else
        M.agent(rest)
      end
    end,
  },
  status = { run = function() M.show_status() end },
  next = { run = function() M.next() end },
  another = { run = function() M.another_next_edit() end },
  feedback = { run = function() M.feedback() end },
  record = { args = { 'on', 'off' } },
  share = { args = { 'on', 'off' } },
}

local function on_off(name, rest, fn)
  if rest ~= 'on' and rest ~= 'off' then
    return notify((':Squid %s on|off'):format(name), vim.log.levels.ERROR)
  end
  fn(rest == 'on')
end
subcommands.record.run = function(_, rest) on_off('record', rest, M.record) end
subcommands.share.run = function(_, rest) on_off('share', rest, M.share) end

local function squid_command(opts)
  local name, rest = opts.args:match('^%s*(%S+)%s*(.-)%s*$')
  local sub = subcommands[name or '']
  if not sub then
    return notify('usage: :Squid agent {instruction} | next | another | status | feedback | record on|off | share on|off',
      vim.log.levels.ERROR)
  end
  sub.run(opts, rest)
end

local function complete_squid(arglead, cmdline)
  local words = vim.split(cmdline:gsub('^%S*%s*', ''), '%s+')
  local choices = #words <= 1 and vim.tbl_keys(subcommands) or (subcommands[words[1]] or {}).args or {}
  table.sort(choices)
  return vim.tbl_filter(function(c) return vim.startswith(c, arglead) end, choices)
end

--- Handlers, commands and autocommands; called by the plugin file and by setup() (idempotent).
function M.register()
  if registered then
    return
  end
  registered = true
  vim.lsp.config(M.name, {
    handlers = {
      ['squidcode/status'] = function(_, status)
        M.state.status = status
        vim.cmd.redrawstatus()
      end,
      ['squidcode/indexStatus'] = function(_, index)
        M.state.index = index
      end,
    },
  })
  vim.lsp.commands[M.commands.accept] = report_acceptance
  vim.api.nvim_create_autocmd('LspProgress', {
    group = vim.api.nvim_create_augroup('squidcode.progress', {}),
    callback = function(ev)
      local client = vim.lsp.get_client_by_id(ev.data.client_id)
      if not client or client.name ~= M.name then
        return
      end
      local value = ev.data.params.value or {}
      if value.kind == 'end' then
        M.state.progress = nil
      else
        local previous = M.state.progress or {}
        M.state.progress = {
          title = value.title or previous.title,
          message = value.message,
          percentage = value.percentage,
        }
      end
      vim.cmd.redrawstatus()
    end,
  })
  vim.api.nvim_create_user_command('Squid', squid_command, {
    nargs = '+',
    range = true,
    complete = complete_squid,
    desc = 'squidcode: agent {instruction} (on a range) | next | another | status | feedback | record on|off | share on|off',
  })
end

--- Configures and enables the server. Options (all optional): cmd, settings, backend_url,
--- filetypes, accept_key ('<Tab>'; false for none), inline (true), next_edit_key (normal mode:
--- show the next edit, then accept it; none by default), another_edit_key (normal mode: wave off the
--- next edit shown and show the one after it; none by default).
function M.setup(opts)
  opts = opts or {}
  M.register()
  local settings = vim.deepcopy(opts.settings or {})
  if opts.backend_url then
    settings.agent = vim.tbl_extend('force', settings.agent or {}, { backend = 'openai', base_url = opts.backend_url })
  end
  local config = {}
  if opts.cmd then
    config.cmd = opts.cmd
  end
  if opts.filetypes then
    config.filetypes = opts.filetypes
  end
  -- vim.empty_dict(), not {}: an empty Lua table would go out as a JSON array.
  config.init_options = next(settings) and settings or vim.empty_dict()
  vim.lsp.config(M.name, config)
  vim.lsp.enable(M.name)
  if opts.inline ~= false and vim.lsp.inline_completion then
    vim.lsp.inline_completion.enable()
  end
  local key = opts.accept_key == nil and '<Tab>' or opts.accept_key
  if key then
    vim.keymap.set('i', key, function()
      if not M.accept() then
        return vim.keycode(key)
      end
    end, { expr = true, desc = 'squidcode: accept the inline completion (and report it)' })
  end
  if opts.next_edit_key then
    vim.keymap.set('n', opts.next_edit_key, M.next, { desc = 'squidcode: show the next edit, then accept it' })
  end
  if opts.another_edit_key then
    vim.keymap.set('n', opts.another_edit_key, M.another_next_edit,
      { desc = 'squidcode: wave off the next edit shown and show the one after it' })
  end
  M.options = opts
  return M
end

return M
