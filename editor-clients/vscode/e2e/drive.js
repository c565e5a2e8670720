// Drives a real VS Code (code-server) with the squidcode extension installed, headless, in Chromium.
//
//   node e2e/drive.js CONFIG.json
//
// CONFIG: { codeServer, vsix, workspace, file, serverCommand, artifacts, result, port,
//           chromium?, timeoutMs?, agentInstruction?, nextEdit?: { file, text, line, typed: { old, new } } }
// Steps: install the .vsix, start code-server, open the workspace and the file, wait for the
// extension's status bar item to say the model is loaded, type at the end of the file, wait for the
// inline completion's ghost text in the editor's DOM, accept it with Tab and save; then (when the
// server offers squidcode.agent.run) select lines, run "squidcode: Ask the agent about the selection",
// and save; then "squidcode: Show server status" and "Show feedback recording status"; last (with
// `nextEdit`) a rename typed in a second file, its next edits accepted with Tab. Each step
// leaves a screenshot in `artifacts`; the JSON report goes to `result` after every step (a killed run
// still leaves a partial one). The caller (tests/e2e/test_vscode.py) judges the report and the files.
'use strict';

const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { chromium } = require('playwright-core');

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const timeoutMs = config.timeoutMs ?? 120000;
const report = { steps: [], errors: [] };
const dataDir = path.join(config.artifacts, 'user-data');
const extDir = path.join(config.artifacts, 'extensions');

function save() {
  fs.writeFileSync(config.result, JSON.stringify(report, null, 2));
}

let page;
let shot = 0;
async function step(name, fn) {
  const entry = { name, started: Date.now() };
  report.steps.push(entry);
  save();
  try {
    entry.value = await fn();
    entry.ok = true;
  } catch (err) {
    entry.ok = false;
    entry.error = String(err && err.stack ? err.stack : err);
    report.errors.push(`${name}: ${err && err.message ? err.message : err}`);
  } finally {
    entry.ms = Date.now() - entry.started;
    if (page) {
      shot += 1;
      const file = path.join(config.artifacts, `${String(shot).padStart(2, '0')}-${name}.png`);
      await page.screenshot({ path: file }).catch(() => {});
      entry.screenshot = file;
    }
    save();
  }
  if (!entry.ok) {
    throw new Error(`step ${name} failed`);
  }
  return entry.value;
}

function writeSettings() {
  const user = path.join(dataDir, 'User');
  fs.mkdirSync(user, { recursive: true });
  const settings = {
    'security.workspace.trust.enabled': false,
    'workbench.startupEditor': 'none',
    'workbench.tips.enabled': false,
    'workbench.enableExperiments': false,
    'extensions.autoCheckUpdates': false,
    'extensions.autoUpdate': false,
    'telemetry.telemetryLevel': 'off',
    'update.mode': 'none',
    // Ghost text only: no suggest widget competing for Tab.
    'editor.inlineSuggest.enabled': true,
    'editor.quickSuggestions': { other: 'off', comments: 'off', strings: 'off' },
    'editor.suggestOnTriggerCharacters': false,
    'editor.acceptSuggestionOnEnter': 'off',
    'editor.minimap.enabled': false,
    'files.autoSave': 'off',
    'files.insertFinalNewline': false,
    'files.trimTrailingWhitespace': false,
    'squidcode.server.command': config.serverCommand,
    'squidcode.serverSettings': config.serverSettings ?? {},
  };
  if (config.backendUrl) {
    settings['squidcode.backend.url'] = config.backendUrl;
  }
  fs.writeFileSync(path.join(user, 'settings.json'), JSON.stringify(settings, null, 2));
}

function installExtension() {
  const run = spawnSync(
    config.codeServer,
    ['--install-extension', config.vsix, '--extensions-dir', extDir, '--user-data-dir', dataDir, '--force'],
    { encoding: 'utf8', timeout: 120000 },
  );
  if (run.status !== 0) {
    throw new Error(`--install-extension failed (${run.status}): ${run.stderr || run.stdout}`);
  }
  return fs.readdirSync(extDir).filter((d) => d.startsWith('squidcode.'));
}

async function startCodeServer() {
  const args = [
    '--auth', 'none', '--bind-addr', `127.0.0.1:${config.port}`, '--disable-telemetry',
    '--disable-update-check', '--disable-workspace-trust', '--disable-getting-started-override',
    '--user-data-dir', dataDir, '--extensions-dir', extDir, config.workspace,
  ];
  const log = fs.openSync(path.join(config.artifacts, 'code-server.log'), 'w');
  // Its own process group: stopping it stops its extension host and the squidcode server too.
  const child = spawn(config.codeServer, args, { stdio: ['ignore', log, log], detached: true });
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) {
      throw new Error(`code-server exited with ${child.exitCode} (see code-server.log)`);
    }
    try {
      const res = await fetch(`http://127.0.0.1:${config.port}/healthz`);
      if (res.ok) {
        return child;
      }
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error('code-server did not answer /healthz within 60 s');
}

/** The squidcode output channel's log file (a LogOutputChannel is written to the logs folder). */
function extensionLog() {
  const found = [];
  const walk = (dir) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) {
        walk(full);
      } else if (/squidcode\.log$/.test(entry.name)) {
        found.push(full);
      }
    }
  };
  if (fs.existsSync(path.join(dataDir, 'logs'))) {
    walk(path.join(dataDir, 'logs'));
  }
  return found.map((f) => fs.readFileSync(f, 'utf8')).join('\n');
}

function stopGroup(pid) {
  for (const signal of ['SIGTERM', 'SIGKILL']) {
    try {
      process.kill(-pid, signal);
    } catch {
      return; // the group is gone
    }
    spawnSync('sleep', ['2']);
  }
}

async function waitFor(what, fn, ms = timeoutMs, interval = 200) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    last = await fn();
    if (last) {
      return last;
    }
    await page.waitForTimeout(interval);
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what}`);
}

// The extension's item (id `<extension id>.squidcode.status`), not VS Code's progress item.
const statusItem = () => page.locator('.statusbar-item[id$="squidcode.status"]').first();
const clean = (s) => (s || '').replace(/\u00a0/g, ' ');

async function runCommand(title) {
  await page.keyboard.press('F1');
  const input = page.locator('.quick-input-widget input').first();
  await input.waitFor({ state: 'visible', timeout: 10000 });
  await input.fill(`>${title}`);
  const row = page.locator('.quick-input-list .monaco-list-row').filter({ hasText: title }).first();
  await row.waitFor({ state: 'visible', timeout: 10000 });
  await page.keyboard.press('Enter');
}

async function notificationText(pattern) {
  return waitFor(`a notification matching ${pattern}`, async () => {
    const texts = await page.locator('.notification-list-item-message').allTextContents();
    return texts.map(clean).find((t) => pattern.test(t));
  }, 30000);
}

async function saveAndRead(previous, file = config.file) {
  await page.keyboard.press('Control+S');
  return waitFor('the file saved to disk', async () => {
    const text = fs.readFileSync(file, 'utf8');
    return text !== previous ? text : undefined;
  }, 15000);
}

async function openEditor() {
  await step('open-workspace', async () => {
    await page.goto(`http://127.0.0.1:${config.port}/?folder=${encodeURIComponent(config.workspace)}`);
    await page.locator('.monaco-workbench').waitFor({ timeout: 60000 });
  });
  await step('open-file', async () => {
    await page.keyboard.press('Control+P');
    await page.locator('.quick-input-widget input').first().waitFor({ state: 'visible', timeout: 15000 });
    await page.keyboard.type(path.basename(config.file));
    await page.locator('.quick-input-list .monaco-list-row').first().waitFor({ timeout: 15000 });
    await page.keyboard.press('Enter');
    await page.locator('.monaco-editor .view-lines').first().waitFor({ timeout: 15000 });
    return clean(await page.locator('.monaco-editor .view-lines').first().innerText()).slice(0, 200);
  });
  report.status_bar_ids = await page.locator('.statusbar-item').evaluateAll((els) => els.map((e) => e.id));
  report.status_bar = await step('model-loaded', async () =>
    waitFor('the status bar item to show a loaded model', async () => {
      const text = clean(await statusItem().innerText().catch(() => '')).trim();
      return /squidcode: (?!loading|model failed)/.test(text) ? text : undefined;
    }));
  report.commands = await step('server-commands', async () => {
    const line = await waitFor('the extension log naming the server commands', async () =>
      extensionLog().split('\n').find((l) => l.includes('server commands: ')), 15000);
    return JSON.parse(line.slice(line.indexOf('server commands: ') + 'server commands: '.length));
  });
}

const ghostText = () => page.locator('.monaco-editor [class*="ghost-text"]');

async function ghostTextAndTab(editor) {
  const original = fs.readFileSync(config.file, 'utf8');
  report.ghost = await step('ghost-text', async () => {
    await editor.focus();
    await page.keyboard.press('Control+End');
    await page.keyboard.type(config.typed ?? 'return ', { delay: 40 });
    return waitFor('inline completion ghost text in the editor', async () => {
      const text = clean((await ghostText().allTextContents()).join('')).trim();
      return text ? text : undefined;
    });
  });
  report.after_tab = await step('accept-with-tab', async () => {
    await page.keyboard.press('Tab');
    await waitFor('the ghost text to be gone', async () => (await ghostText().count()) === 0, 10000);
    return saveAndRead(original);
  });
  report.accept_log = extensionLog().split('\n').filter((l) => l.includes('squidcode.completion.accept'));
}

async function agentOnSelection(editor) {
  const before = fs.readFileSync(config.file, 'utf8');
  report.after_agent = await step('agent-edit', async () => {
    await editor.focus();
    await page.keyboard.press('Control+Home');
    for (let i = 0; i < (config.selectLines ?? 3); i += 1) {
      await page.keyboard.press('Shift+ArrowDown');
    }
    await runCommand('squidcode: Ask the agent about the selection');
    await page.locator('.quick-input-widget input').first().waitFor({ state: 'visible', timeout: 10000 });
    await page.keyboard.type(config.agentInstruction ?? 'add a comment saying what this code does');
    await page.keyboard.press('Enter');
    await waitFor('the agent result in the extension log', async () =>
      /agent edit (applied|was not applied)|proposed no edit|error: /.test(extensionLog()), 240000, 500);
    return saveAndRead(before).catch(() => fs.readFileSync(config.file, 'utf8'));
  });
}

async function statusCommands() {
  report.status_notification = await step('show-status', async () => {
    await runCommand('squidcode: Show server status');
    return notificationText(/model: /);
  });
  report.feedback_notification = await step('feedback-status', async () => {
    await runCommand('squidcode: Show feedback recording status');
    return notificationText(/squidcode feedback:|squidcode\.feedback\.status/);
  });
}

const acceptsReported = () =>
  extensionLog().split('\n').filter((l) => l.includes('executeCommand squidcode.completion.accept ok')).length;
const nextEditLines = () => extensionLog().split('\n').filter((l) => l.includes('next edit at '));

/** The next `next edit at` line of the extension log after the first `seen` of them. */
async function nextEditShown(seen) {
  return waitFor('a next edit in the extension log', async () => nextEditLines()[seen], 30000);
}

// A rename typed in a second file (written now, so the index counts above stay as they are): the
// next use is shown as a decoration; `config.nextEdit.keys` are pressed on the edits shown in turn
// (Tab accepts one and moves to the one after, shown as ghost text on the cursor's line; Alt+] waves
// one off for the place after it).
async function nextEditAndTab(editor) {
  const { file, text, line, typed, importer } = config.nextEdit;
  fs.writeFileSync(file, text);
  if (importer) {
    fs.writeFileSync(importer.file, importer.text); // now, so that the index has it by the time it is needed
  }
  report.next_edit_shown = [];
  report.after_next_edit = await step('next-edit', async () => {
    // The new file's row, not the first one (the file opened before, until the new one is found).
    // Quick Open lists a file written while it runs once VS Code's file search has seen it: on a
    // loaded machine that can take longer than one opening of the picker waits, so it is reopened.
    const row = page.locator('.quick-input-list .monaco-list-row').filter({ hasText: path.basename(file) }).first();
    for (let attempt = 1; ; attempt += 1) {
      await page.keyboard.press('Control+P');
      await page.locator('.quick-input-widget input').first().waitFor({ state: 'visible', timeout: 15000 });
      await page.keyboard.type(path.basename(file));
      try {
        await row.waitFor({ timeout: 10000 });
        break;
      } catch (error) {
        if (attempt >= 4) throw error;
        await page.keyboard.press('Escape');
      }
    }
    await row.click();
    await waitFor('the file in the editor', async () =>
      clean(await page.locator('.monaco-editor .view-lines').first().innerText()).includes(text.split('\n')[0]), 15000);
    await editor.focus();
    await page.keyboard.press('Control+Home');
    for (let i = 1; i < line; i += 1) {
      await page.keyboard.press('ArrowDown');
    }
    await page.keyboard.press('Home'); // the line's first word: the name to rename
    await page.keyboard.press('Control+Shift+ArrowRight');
    const seen = nextEditLines().length;
    const accepted = acceptsReported();
    await page.keyboard.insertText(typed.new);
    // Each key on the edit shown then: Tab accepts it, Alt+] waves it off for the place after it.
    const keys = config.nextEdit.keys ?? ['Tab', 'Tab'];
    for (const [shown, key] of keys.entries()) {
      const entry = await nextEditShown(seen + shown);
      report.next_edit_shown.push(entry);
      if (entry.includes('shown inline')) {
        report.next_edit_ghost = await waitFor('the next edit as ghost text', async () =>
          clean((await ghostText().allTextContents()).join('')).trim() || undefined, 15000);
      } else {
        // As a user sees it: the decoration alone, no completion's ghost text (which Tab would take).
        await waitFor('no ghost text beside the decoration', async () => (await ghostText().count()) === 0, 10000);
      }
      await page.keyboard.press(key);
    }
    const tabs = keys.filter((key) => key === 'Tab').length;
    await waitFor('the accepts reported', async () => acceptsReported() >= accepted + tabs, 15000);
    return saveAndRead(text, file);
  });
  if (importer) {
    await nextEditElsewhere(editor, importer);
  }
}

// The function itself renamed at its def (`importer.renamed` at line 1, column `importer.column`):
// no use is left in its file, so the next edit is in the file that imports it, a hint at the cursor;
// Tab opens that file at the edit, shown there; Tab accepts it, and the call below comes next; Tab.
async function nextEditElsewhere(editor, importer) {
  report.next_edit_elsewhere = [];
  report.after_next_edit_elsewhere = await step('next-edit-elsewhere', async () => {
    await editor.focus();
    await page.keyboard.press('Control+Home');
    for (let i = 0; i < importer.column; i += 1) {
      await page.keyboard.press('ArrowRight');
    }
    await page.keyboard.press('Control+Shift+ArrowRight');
    const seen = nextEditLines().length;
    const accepted = acceptsReported();
    await page.keyboard.insertText(importer.renamed.new);
    for (let shown = 0; shown < 3; shown += 1) {
      report.next_edit_elsewhere.push(await nextEditShown(seen + shown));
      await waitFor('no ghost text beside the hint', async () => (await ghostText().count()) === 0, 10000);
      await page.keyboard.press('Tab');
    }
    await waitFor('both accepts reported', async () => acceptsReported() >= accepted + 2, 15000);
    return saveAndRead(importer.text, importer.file);
  });
}

async function main() {
  fs.mkdirSync(config.artifacts, { recursive: true });
  writeSettings();
  report.installed = await step('install-extension', async () => installExtension());
  const server = await step('start-code-server', async () => ({ pid: (await startCodeServer()).pid }));
  let browser;
  try {
    browser = await chromium.launch({
      executablePath: config.chromium ?? '/usr/bin/chromium',
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking',
        '--disable-component-update', '--disable-sync', '--no-first-run'],
    });
    page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await openEditor();
    const editor = page.locator('.monaco-editor textarea').first();
    await ghostTextAndTab(editor);
    if (report.commands.includes('squidcode.agent.run')) {
      await agentOnSelection(editor);
    } else {
      report.agent_skipped = 'the server does not advertise squidcode.agent.run';
    }
    await statusCommands();
    if (config.nextEdit) {
      await nextEditAndTab(editor);
    }
  } finally {
    report.extension_log = extensionLog();
    save();
    if (browser) {
      await browser.close().catch(() => {});
    }
    stopGroup(server.pid);
  }
}

main()
  .catch((err) => {
    if (!report.errors.length) {
      report.errors.push(String(err && err.stack ? err.stack : err));
    }
  })
  .finally(() => {
    report.ok = report.errors.length === 0;
    save();
    process.exit(report.ok ? 0 : 1);
  });
