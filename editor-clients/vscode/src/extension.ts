// squidcode for VS Code: starts `squidcode serve`, hands it the user's settings, and exposes the
// server's features (inline completions, next edits, the agent, feedback consent, status) as VS Code
// commands and a status bar item. Everything smart happens in the server.

import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
  State,
  type WorkspaceEdit as LspWorkspaceEdit,
} from 'vscode-languageclient/node';

import {
  advertisedCommands,
  agentRunArgs,
  type AgentRunResult,
  Commands,
  describeAgentResult,
  describeFeedback,
  type FeedbackStatus,
  type IndexStatus,
  missingCommandMessage,
  Notifications,
  type ServerStatus,
} from './protocol';
import { NextEditController, type NextEditServer } from './nextEditController';
import { type ReadSetting, serverCommand, toServerSettings } from './settings';
import { statusBarView } from './status';

const SECTION = 'squidcode';

let client: LanguageClient | undefined;
let output: vscode.LogOutputChannel;
let statusItem: vscode.StatusBarItem;
let lastStatus: ServerStatus | undefined;
let lastIndex: IndexStatus | undefined;
let nextEdits: NextEditController | undefined;

const readSetting: ReadSetting = (key) => {
  const config = vscode.workspace.getConfiguration(SECTION);
  const seen = config.inspect(key);
  const explicit = [seen?.globalValue, seen?.workspaceValue, seen?.workspaceFolderValue].some(
    (v) => v !== undefined,
  );
  return { value: config.get(key), explicit };
};

function log(line: string): void {
  output.info(line);
}

function renderStatus(): void {
  const view = statusBarView(lastStatus, lastIndex);
  statusItem.text = view.text;
  statusItem.tooltip = view.tooltip;
  statusItem.backgroundColor =
    view.severity === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
}

function createClient(): LanguageClient {
  const { command, args } = serverCommand(vscode.workspace.getConfiguration(SECTION).get('server.command'));
  const serverOptions: ServerOptions = { command, args };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    outputChannel: output,
    initializationOptions: toServerSettings(readSetting),
    middleware: {
      workspace: {
        // The server pulls its `squidcode` section; it gets the mapped settings, not VS Code's raw tree.
        configuration: (params) =>
          params.items.map((item) => (item.section === SECTION ? toServerSettings(readSetting) : null)),
      },
      // Server commands VS Code runs for the server (e.g. squidcode.completion.accept, attached to each
      // inline completion and run on Tab) are logged, so acceptance is visible in the output.
      executeCommand: async (command, args, next) => {
        log(`executeCommand ${command} ${JSON.stringify(args)}`);
        try {
          const result = await next(command, args);
          log(`executeCommand ${command} ok`);
          return result;
        } catch (err) {
          log(`executeCommand ${command} failed: ${err instanceof Error ? err.message : String(err)}`);
          throw err;
        }
      },
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        // A next edit shown on this line is the ghost text (src/nextEditController.ts).
        const own = nextEdits?.inlineItem(document, position);
        if (own) {
          return own;
        }
        if (vscode.workspace.getConfiguration(SECTION).get('completion.enabled') === false ||
            nextEdits?.holdsTab(document)) {
          return undefined; // off, or a next edit's decoration is shown: Tab is its
        }
        const items = await next(document, position, context, token);
        if (nextEdits?.holdsTab(document)) {
          return undefined; // a next edit was shown meanwhile: Tab is its
        }
        const list = Array.isArray(items) ? items : items?.items;
        if (list?.length) {
          const first = list[0].insertText;
          const text = typeof first === 'string' ? first : first.value;
          log(`inline completion at ${position.line + 1}:${position.character + 1}: ${JSON.stringify(text.slice(0, 120))}`);
        }
        // The server's next-edit items (a range that replaces text): accepting one goes on to the next.
        return list && nextEdits ? list.map((item) => nextEdits!.routeInline(item)) : items;
      },
    },
  };
  const created = new LanguageClient(SECTION, 'squidcode', serverOptions, clientOptions);
  created.onNotification(Notifications.status, (status: ServerStatus) => {
    lastStatus = status;
    renderStatus();
  });
  created.onNotification(Notifications.indexStatus, (index: IndexStatus) => {
    lastIndex = index;
    renderStatus();
  });
  created.onDidChangeState((event) => {
    if (event.newState === State.Stopped) {
      lastStatus = undefined;
      statusItem.text = '$(circle-slash) squidcode: stopped';
    }
  });
  return created;
}

async function startClient(): Promise<void> {
  try {
    client = createClient();
    await client.start();
    const capabilities = client.initializeResult?.capabilities;
    log(`server started: ${JSON.stringify(client.initializeResult?.serverInfo ?? {})}`);
    log(`server commands: ${JSON.stringify(advertisedCommands(capabilities))}`);
    if (!missingCommandMessage(capabilities, Commands.status)) {
      lastStatus = (await runServerCommand(Commands.status, {})) as ServerStatus;
      renderStatus();
    }
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    log(`server failed to start: ${message}`);
    statusItem.text = '$(error) squidcode: not running';
    void vscode.window.showErrorMessage(
      `squidcode: the server did not start (${message}). Set "squidcode.server.command" to your squidcode ` +
        'binary, e.g. ["/path/to/squidcode/.venv/bin/squidcode", "serve"].',
    );
  }
}

/** Runs a server command through workspace/executeCommand; refuses one the server does not list. */
async function runServerCommand(command: string, args: object): Promise<unknown> {
  if (!client || !client.isRunning()) {
    throw new Error('the squidcode server is not running (see the squidcode output).');
  }
  const missing = missingCommandMessage(client.initializeResult?.capabilities, command);
  if (missing) {
    throw new Error(missing);
  }
  log(`executeCommand ${command} ${JSON.stringify(args)}`);
  return client.sendRequest(ExecuteCommandRequest.type, { command, arguments: [args] });
}

function reportError(err: unknown): void {
  const message = err instanceof Error ? err.message : String(err);
  log(`error: ${message}`);
  void vscode.window.showErrorMessage(`squidcode: ${message}`);
}

async function askAgent(options?: { instruction?: string }): Promise<void> {
  const editor = vscode.window.activeTextEditor;
  if (!editor) {
    void vscode.window.showWarningMessage('squidcode: open a file and select the code for the agent first.');
    return;
  }
  const instruction =
    options?.instruction ??
    (await vscode.window.showInputBox({
      title: 'squidcode agent',
      prompt: editor.selection.isEmpty ? 'What should the agent do in this file?' : 'What should the agent do with the selection?',
      placeHolder: 'e.g. add a docstring',
    }));
  if (instruction === undefined) {
    return; // dismissed
  }
  try {
    const sel = editor.selection;
    const args = agentRunArgs(instruction, editor.document.uri.toString(), {
      start: { line: sel.start.line, character: sel.start.character },
      end: { line: sel.end.line, character: sel.end.character },
    });
    log(`agent: ${JSON.stringify(args)}`);
    const result = (await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: 'squidcode agent', cancellable: false },
      () => runServerCommand(Commands.agentRun, args),
    )) as AgentRunResult;
    describeAgentResult(result).forEach(log);
    if (!result.edit || !client) {
      void vscode.window.showInformationMessage('squidcode: the agent proposed no edit (see the squidcode output).');
      return;
    }
    const edit = await client.protocol2CodeConverter.asWorkspaceEdit(result.edit as LspWorkspaceEdit);
    const applied = await vscode.workspace.applyEdit(edit);
    log(`agent edit ${applied ? 'applied' : 'was not applied'}`);
    if (applied && result.episodeId) {
      // The server follows the edit from here on (kept, rewritten or reverted).
      void runServerCommand(Commands.agentApplied, { episodeId: result.episodeId }).catch(reportError);
    }
    if (!applied) {
      void vscode.window.showWarningMessage('squidcode: the agent edit could not be applied (the file changed?).');
    }
  } catch (err) {
    reportError(err);
  }
}

async function feedbackCommand(command: string, args: object): Promise<void> {
  try {
    const status = (await runServerCommand(command, args)) as FeedbackStatus;
    const line = describeFeedback(status);
    log(line);
    void vscode.window.showInformationMessage(line);
  } catch (err) {
    reportError(err);
  }
}

async function showStatus(): Promise<void> {
  try {
    lastStatus = (await runServerCommand(Commands.status, {})) as ServerStatus;
    renderStatus();
    const view = statusBarView(lastStatus, lastIndex);
    log(view.tooltip.replace(/\n/g, ' | '));
    void vscode.window.showInformationMessage(view.tooltip.replace(/\n/g, ' — '));
  } catch (err) {
    reportError(err);
  }
}

function onConfigurationChanged(event: vscode.ConfigurationChangeEvent): void {
  if (!event.affectsConfiguration(SECTION)) {
    return;
  }
  if (event.affectsConfiguration(`${SECTION}.server.command`)) {
    void restart();
    return;
  }
  if (client?.isRunning()) {
    void client.sendNotification(DidChangeConfigurationNotification.type, {
      settings: { [SECTION]: toServerSettings(readSetting) },
    });
  }
}

async function restart(): Promise<void> {
  const old = client;
  client = undefined;
  if (old) {
    await old.stop().catch((err: unknown) => log(`stop failed: ${String(err)}`));
  }
  await startClient();
}

function nextEditServer(running: LanguageClient): NextEditServer {
  return {
    request: (method, params) => running.sendRequest(method, params),
    // Through VS Code's command, so the client's executeCommand middleware logs it as it does Tab's.
    executeCommand: async (command) => vscode.commands.executeCommand(command.command, ...(command.arguments ?? [])),
  };
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel('squidcode', { log: true });
  statusItem = vscode.window.createStatusBarItem('squidcode.status', vscode.StatusBarAlignment.Right, 100);
  statusItem.name = 'squidcode';
  statusItem.command = 'squidcode.showStatus';
  renderStatus();
  statusItem.show();
  nextEdits = new NextEditController(
    () => (client?.isRunning() ? nextEditServer(client) : undefined),
    () => vscode.workspace.getConfiguration(SECTION).get('nextEdit.enabled') !== false,
    log,
  );
  context.subscriptions.push(
    nextEdits,
    output,
    statusItem,
    vscode.commands.registerCommand('squidcode.askAgent', askAgent),
    vscode.commands.registerCommand('squidcode.feedbackStatus', () => feedbackCommand(Commands.feedbackStatus, {})),
    vscode.commands.registerCommand('squidcode.recordOn', () => feedbackCommand(Commands.feedbackSetRecord, { on: true })),
    vscode.commands.registerCommand('squidcode.recordOff', () => feedbackCommand(Commands.feedbackSetRecord, { on: false })),
    vscode.commands.registerCommand('squidcode.shareOn', () => feedbackCommand(Commands.feedbackSetShare, { on: true })),
    vscode.commands.registerCommand('squidcode.shareOff', () => feedbackCommand(Commands.feedbackSetShare, { on: false })),
    vscode.commands.registerCommand('squidcode.showStatus', showStatus),
    vscode.commands.registerCommand('squidcode.showOutput', () => output.show(true)),
    vscode.commands.registerCommand('squidcode.restart', restart),
    vscode.workspace.onDidChangeConfiguration(onConfigurationChanged),
  );
  await startClient();
}

export async function deactivate(): Promise<void> {
  if (client) {
    await client.stop();
    client = undefined;
  }
}
