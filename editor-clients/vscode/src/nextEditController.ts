// Next-edit suggestions in the editor: after a pause in typing, asks the server for the next edit
// (`squidcode/nextEdit`) and shows it: as ghost text when it is on the cursor's line and VS Code can
// draw it so (insertions only), otherwise as a decoration at the edit (the replaced text struck
// through, the new text after it). Tab accepts it (VS Code's own Tab for ghost text), runs the
// server's accept command, then asks for the edit after it and moves the cursor there. Esc dismisses.
// Alt+] waves a decoration's edit off and shows the place after it (those waved off stay off until
// the document changes).
// An edit in another file (a rename carried to a file that imports the name) is a hint at the
// cursor's line naming that file; Tab opens it there and shows the edit, and Tab again accepts it.
// While a decoration is shown, Tab is its: a completion's ghost text is hidden and none is shown.

import * as vscode from 'vscode';

import {
  decorationText,
  describeNextEdit,
  type Display,
  displayOf,
  elsewhereText,
  endAfterApplying,
  fileName,
  firstEdit,
  inOtherDocument,
  NEXT_EDIT_METHOD,
  type NextEdit,
  nextEditParams,
  type Place,
  placeOf,
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
export const ANOTHER_COMMAND = 'squidcode.nextEdit.another';
const SHOWN_CONTEXT = 'squidcode.nextEditShown';
// A pause in typing, not every keystroke: a rename typed over a name is one edit once it is typed.
const PAUSE_MS = 250;

interface Shown {
  document: vscode.TextDocument;
  version: number;
  edit: NextEdit;
  range: vscode.Range;
  /** 'elsewhere': the edit is in another file; `range` is where its hint stands in `document`. */
  display: Display | 'elsewhere';
}

const toVscode = (p: Position) => new vscode.Position(p.line, p.character);

export class NextEditController implements vscode.Disposable {
  private shown: Shown | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private asked = 0; // the newest request; an older answer is dropped
  private jumping = false; // opening another file's edit: the editor change is ours, not the user's
  /** The places waved off (Alt+]) at a version of a document: they stay off until it changes. */
  private waved: { document: vscode.TextDocument; version: number; places: Place[] } | undefined;
  private readonly decoration = vscode.window.createTextEditorDecorationType({
    backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
    textDecoration: 'line-through',
    after: { color: new vscode.ThemeColor('editorGhostText.foreground'), fontStyle: 'italic' },
  });
  private readonly hint = vscode.window.createTextEditorDecorationType({
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
      this.hint,
      vscode.workspace.onDidChangeTextDocument((event) => this.onChange(event)),
      vscode.window.onDidChangeActiveTextEditor(() => {
        if (!this.jumping) {
          this.clear();
        }
      }),
      vscode.commands.registerCommand(ACCEPT_COMMAND, () => this.accept()),
      vscode.commands.registerCommand(ACCEPTED_INLINE_COMMAND, (command?: ServerCommand, end?: Position) =>
        this.acceptedInline(command, end),
      ),
      vscode.commands.registerCommand(DISMISS_COMMAND, () => this.clear()),
      vscode.commands.registerCommand(ANOTHER_COMMAND, () => this.another()),
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
    return this.shown !== undefined && this.shown.display !== 'inline' && this.shown.document === document;
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
    // One request per pause in typing: a change within the pause replaces the one waiting (two timers
    // would ask twice, and an answer that came back before the second asked was shown twice).
    clearTimeout(this.timer);
    if (this.enabled()) {
      this.timer = setTimeout(() => void this.refresh(editor, editor.selection.active, false), PAUSE_MS);
    }
  }

  /** Ask for the next edit at `position` and show it; `jump`: move the cursor to it first;
   * `dismissed`: places waved off at this version (the server answers with the one after them). */
  private async refresh(editor: vscode.TextEditor, position: vscode.Position, jump: boolean,
                        dismissed: Place[] = []): Promise<void> {
    const server = this.server();
    if (!server || vscode.window.activeTextEditor !== editor) {
      return;
    }
    const document = editor.document;
    const version = document.version;
    const asked = ++this.asked;
    let edit: NextEdit | undefined;
    try {
      const params = nextEditParams(document.uri.toString(), version, position, dismissed);
      edit = firstEdit(await server.request(NEXT_EDIT_METHOD, params));
    } catch (err) {
      this.log(`next edit: ${err instanceof Error ? err.message : String(err)}`);
      return;
    }
    if (asked !== this.asked || document.version !== version) {
      return; // superseded, or typed on
    }
    if (!edit) {
      if (dismissed.length) {
        this.log('next edit: no other place');
      }
      return; // nothing to offer
    }
    if (inOtherDocument(edit, document.uri.toString())) {
      await this.showElsewhere(editor, edit);
    } else {
      await this.show(editor, edit, jump);
    }
  }

  /** Show `edit`, which is in `editor`'s document; `jump`: move the cursor to it first. */
  private async show(editor: vscode.TextEditor, edit: NextEdit, jump: boolean): Promise<void> {
    const document = editor.document;
    const version = document.version;
    const range = new vscode.Range(toVscode(edit.range.start), toVscode(edit.range.end));
    if (jump) {
      editor.selection = new vscode.Selection(range.start, range.start);
      editor.revealRange(range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
    }
    const old = document.getText(range);
    const display = displayOf(edit, old, editor.selection.active.line);
    const shown: Shown = { document, version, edit, range, display };
    this.shown = shown;
    if (display !== 'inline') {
      editor.setDecorations(this.decoration, [{ range, renderOptions: { after: { contentText: decorationText(edit) } } }]);
    }
    await this.holdTab(shown);
    if (display === 'inline') {
      void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
    }
    if (this.shown === shown) {
      this.log(`${describeNextEdit(edit, old)}, shown ${display === 'inline' ? 'inline' : 'as a decoration'}`);
    }
  }

  /** An edit in another file: a hint at the end of the cursor's line names the file and the change. */
  private async showElsewhere(editor: vscode.TextEditor, edit: NextEdit): Promise<void> {
    const line = editor.document.lineAt(editor.selection.active.line);
    const range = new vscode.Range(line.range.end, line.range.end);
    const document = editor.document;
    const shown: Shown = { document, version: document.version, edit, range, display: 'elsewhere' };
    this.shown = shown;
    editor.setDecorations(this.hint, [{ range, renderOptions: { after: { contentText: elsewhereText(edit, undefined) } } }]);
    await this.holdTab(shown);
    const start = edit.range.start;
    const where = `${fileName(edit.textDocument?.uri ?? '')}:${start.line + 1}:${start.character + 1}`;
    if (this.shown === shown) {
      this.log(`next edit at ${where} (${edit.kind ?? 'edit'}): -> ${JSON.stringify(edit.newText)}, shown as a hint`);
    }
  }

  /** Give Tab to `shown` before it is reported shown: the key binding's context set (awaited, so a
   * Tab pressed once the edit is seen reaches this controller, not the editor's indentation), and
   * beside a decoration or a hint no completion's ghost text. */
  private async holdTab(shown: Shown): Promise<void> {
    await vscode.commands.executeCommand('setContext', SHOWN_CONTEXT, true);
    if (shown.display !== 'inline' && this.shown === shown) {
      await this.hideGhostText();
    }
  }

  /** Tab is the shown decoration's: no completion's ghost text beside it. Hiding alone can lose to a
   * completion VS Code was still drawing when the edit came (its answer left the provider just
   * before); asking again explicitly replaces that one with the provider's answer now, which is none
   * while the decoration holds Tab. */
  private async hideGhostText(): Promise<void> {
    await vscode.commands.executeCommand('editor.action.inlineSuggest.hide');
    await vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
  }

  /** Tab on a hint: open the other file, move to its edit and show it there (Tab again accepts). */
  private async jump(edit: NextEdit): Promise<void> {
    const target = edit.textDocument;
    if (!target) {
      return;
    }
    let editor: vscode.TextEditor;
    this.jumping = true;
    try {
      const document = await vscode.workspace.openTextDocument(vscode.Uri.parse(target.uri));
      if (typeof target.version === 'number' && document.version !== target.version) {
        this.log(`next edit: ${fileName(target.uri)} changed since the edit was found`);
        return;
      }
      editor = await vscode.window.showTextDocument(document, { preview: false });
    } catch (err) {
      this.log(`next edit: could not open ${target.uri}: ${err instanceof Error ? err.message : String(err)}`);
      return;
    } finally {
      this.jumping = false;
    }
    await this.show(editor, edit, true);
  }

  /** Alt+] on a shown edit: not the one meant; wave it off and show the place after it. */
  private async another(): Promise<void> {
    const shown = this.shown;
    const editor = vscode.window.activeTextEditor;
    if (!shown || !editor || editor.document !== shown.document || shown.document.version !== shown.version) {
      return;
    }
    const document = shown.document;
    if (this.waved?.document !== document || this.waved.version !== document.version) {
      this.waved = { document, version: document.version, places: [] };
    }
    this.waved.places.push(placeOf(shown.edit, document.uri.toString()));
    this.clear();
    clearTimeout(this.timer);
    await this.refresh(editor, editor.selection.active, false, [...this.waved.places]);
  }

  /** Tab on a shown edit: apply it, report the acceptance, go to the next one. */
  private async accept(): Promise<void> {
    const shown = this.shown;
    const editor = vscode.window.activeTextEditor;
    this.clear();
    if (!shown || !editor || editor.document !== shown.document || shown.document.version !== shown.version) {
      return;
    }
    if (shown.display === 'elsewhere') {
      await this.jump(shown.edit);
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
      editor.setDecorations(this.hint, []);
    }
    void vscode.commands.executeCommand('setContext', SHOWN_CONTEXT, false);
  }
}
