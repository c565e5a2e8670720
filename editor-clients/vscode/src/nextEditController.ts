// Next-edit suggestions in the editor: after a pause in typing, asks the server for the next edit
// (`squidcode/nextEdit`) and shows it: as ghost text when it is on the cursor's line and VS Code can
// draw it so (insertions only), otherwise as a decoration at the edit (the replaced text struck
// through, the new text after it). Tab accepts it (VS Code's own Tab for ghost text), runs the
// server's accept command, then asks for the edit after it and moves the cursor there. Esc dismisses.
// While a decoration is shown, Tab is its: a completion's ghost text is hidden and none is shown.

import * as vscode from 'vscode';

import {
  decorationText,
  describeNextEdit,
  type Display,
  displayOf,
  endAfterApplying,
  firstEdit,
  NEXT_EDIT_METHOD,
  type NextEdit,
  nextEditParams,
  type ServerCommand,
} from './nextEdit';
import type { Position } from './protocol';

/** What the controller needs of the language client (the extension's, while it runs). */
export interface NextEditServer {
  request(method: string, params: unknown): Promise<unknown>;
  executeCommand(command: ServerCommand): Promise<unknown>;
}

export const ACCEPT_COMMAND = 'squidcode.nextEdit.accept';
export const ACCEPTED_INLINE_COMMAND = 'squidcode.nextEdit.acceptedInline';
export const DISMISS_COMMAND = 'squidcode.nextEdit.dismiss';
const SHOWN_CONTEXT = 'squidcode.nextEditShown';
// A pause in typing, not every keystroke: a rename typed over a name is one edit once it is typed.
const PAUSE_MS = 250;

interface Shown {
  document: vscode.TextDocument;
  version: number;
  edit: NextEdit;
  range: vscode.Range;
  display: Display;
}

const toVscode = (p: Position) => new vscode.Position(p.line, p.character);

export class NextEditController implements vscode.Disposable {
  private shown: Shown | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private asked = 0; // the newest request; an older answer is dropped
  private readonly decoration = vscode.window.createTextEditorDecorationType({
    backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
    textDecoration: 'line-through',
    after: { color: new vscode.ThemeColor('editorGhostText.foreground'), fontStyle: 'italic' },
  });
  private readonly subscriptions: vscode.Disposable[];

  constructor(
    private readonly server: () => NextEditServer | undefined,
    private readonly enabled: () => boolean,
    private readonly log: (line: string) => void,
  ) {
    this.subscriptions = [
      this.decoration,
      vscode.workspace.onDidChangeTextDocument((event) => this.onChange(event)),
      vscode.window.onDidChangeActiveTextEditor(() => this.clear()),
      vscode.commands.registerCommand(ACCEPT_COMMAND, () => this.accept()),
      vscode.commands.registerCommand(ACCEPTED_INLINE_COMMAND, (command?: ServerCommand, end?: Position) =>
        this.acceptedInline(command, end),
      ),
      vscode.commands.registerCommand(DISMISS_COMMAND, () => this.clear()),
    ];
  }

  dispose(): void {
    clearTimeout(this.timer);
    this.subscriptions.forEach((s) => s.dispose());
  }

  /** The shown next edit as a ghost-text item when it is on `position`'s line; else undefined. */
  inlineItem(document: vscode.TextDocument, position: vscode.Position): vscode.InlineCompletionItem[] | undefined {
    const shown = this.shown;
    if (!shown || shown.display !== 'inline' || shown.document !== document || document.version !== shown.version ||
        shown.range.start.line !== position.line) {
      return undefined;
    }
    // The item's range holds the cursor (VS Code draws only such an item); the wider span gives the
    // same text once replaced.
    const start = shown.range.start.isBefore(position) ? shown.range.start : position;
    const end = shown.range.end.isAfter(position) ? shown.range.end : position;
    const text =
      document.getText(new vscode.Range(start, shown.range.start)) + shown.edit.newText +
      document.getText(new vscode.Range(shown.range.end, end));
    return [this.inlineCompletion(text, new vscode.Range(start, end), shown.edit.command)];
  }

  /** Whether a next edit is shown as a decoration in `document` (Tab accepts it, not ghost text). */
  holdsTab(document: vscode.TextDocument): boolean {
    return this.shown?.display === 'decoration' && this.shown.document === document;
  }

  /** An item of the server's whose range replaces text (a next edit on the cursor's line), with its
   * accept command routed through this controller so that accepting it jumps to the next one. */
  routeInline(item: vscode.InlineCompletionItem): vscode.InlineCompletionItem {
    const range = item.range;
    if (!range || range.isEmpty || typeof item.insertText !== 'string') {
      return item;
    }
    const command = item.command ? { title: item.command.title, command: item.command.command,
      arguments: item.command.arguments } : undefined;
    return this.inlineCompletion(item.insertText, range, command);
  }

  private inlineCompletion(text: string, range: vscode.Range, command?: ServerCommand): vscode.InlineCompletionItem {
    const end = { line: range.start.line, character: range.start.character + text.length };
    return new vscode.InlineCompletionItem(text, range, {
      title: 'squidcode: accept next edit', command: ACCEPTED_INLINE_COMMAND, arguments: [command, end],
    });
  }

  private onChange(event: vscode.TextDocumentChangeEvent): void {
    const editor = vscode.window.activeTextEditor;
    if (!event.contentChanges.length || editor?.document !== event.document) {
      return;
    }
    this.clear();
    if (this.enabled()) {
      this.timer = setTimeout(() => void this.refresh(editor, editor.selection.active, false), PAUSE_MS);
    }
  }

  /** Ask for the next edit at `position` and show it; `jump`: move the cursor to it first. */
  private async refresh(editor: vscode.TextEditor, position: vscode.Position, jump: boolean): Promise<void> {
    const server = this.server();
    if (!server || vscode.window.activeTextEditor !== editor) {
      return;
    }
    const document = editor.document;
    const version = document.version;
    const asked = ++this.asked;
    let edit: NextEdit | undefined;
    try {
      edit = firstEdit(await server.request(NEXT_EDIT_METHOD, nextEditParams(document.uri.toString(), version, position)));
    } catch (err) {
      this.log(`next edit: ${err instanceof Error ? err.message : String(err)}`);
      return;
    }
    if (asked !== this.asked || document.version !== version || !edit) {
      return; // superseded, typed on, or nothing to offer
    }
    const range = new vscode.Range(toVscode(edit.range.start), toVscode(edit.range.end));
    if (jump) {
      editor.selection = new vscode.Selection(range.start, range.start);
      editor.revealRange(range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
    }
    const old = document.getText(range);
    const display = displayOf(edit, old, editor.selection.active.line);
    this.shown = { document, version, edit, range, display };
    this.log(`${describeNextEdit(edit, old)}, shown ${display === 'inline' ? 'inline' : 'as a decoration'}`);
    void vscode.commands.executeCommand('setContext', SHOWN_CONTEXT, true);
    if (display === 'inline') {
      void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
    } else {
      editor.setDecorations(this.decoration, [{ range, renderOptions: { after: { contentText: decorationText(edit) } } }]);
      void vscode.commands.executeCommand('editor.action.inlineSuggest.hide');
    }
  }

  /** Tab on a shown edit: apply it, report the acceptance, go to the next one. */
  private async accept(): Promise<void> {
    const shown = this.shown;
    const editor = vscode.window.activeTextEditor;
    this.clear();
    if (!shown || !editor || editor.document !== shown.document || shown.document.version !== shown.version) {
      return;
    }
    const applied = await editor.edit((builder) => builder.replace(shown.range, shown.edit.newText));
    if (!applied) {
      this.log('next edit: could not be applied (the file changed?)');
      return;
    }
    clearTimeout(this.timer); // this controller asks for the next one itself
    await this.reportAccepted(shown.edit.command);
    await this.refresh(editor, toVscode(endAfterApplying(shown.edit)), true);
  }

  /** Ghost text of a next edit accepted with VS Code's Tab: report it, go to the next one. */
  private async acceptedInline(command?: ServerCommand, end?: Position): Promise<void> {
    const editor = vscode.window.activeTextEditor;
    this.clear();
    clearTimeout(this.timer);
    await this.reportAccepted(command);
    if (editor && end) {
      await this.refresh(editor, toVscode(end), true);
    }
  }

  private async reportAccepted(command?: ServerCommand): Promise<void> {
    const server = this.server();
    if (command && server) {
      await server.executeCommand(command).catch((err: unknown) => this.log(`next edit accept: ${String(err)}`));
    }
  }

  clear(): void {
    if (!this.shown) {
      return;
    }
    this.shown = undefined;
    for (const editor of vscode.window.visibleTextEditors) {
      editor.setDecorations(this.decoration, []);
    }
    void vscode.commands.executeCommand('setContext', SHOWN_CONTEXT, false);
  }
}
