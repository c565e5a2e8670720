// Next-edit suggestions (`squidcode/nextEdit`, docs/protocol.md), as the client sees them: the
// request, the answer read defensively, and how an edit is shown. No `vscode` import: unit-tested in
// plain node; src/nextEditController.ts does the showing and accepting.

import type { Position, Range } from './protocol';

export const NEXT_EDIT_METHOD = 'squidcode/nextEdit';

export interface ServerCommand {
  title: string;
  command: string;
  arguments?: unknown[];
}

export interface NextEdit {
  range: Range;
  newText: string;
  kind?: string;
  command?: ServerCommand;
  /** The document the edit is in, when the server names it (another file: a rename carried on). */
  textDocument?: { uri: string; version?: number | null };
}

/** A place offered before and waved off (an LSP Location). */
export interface Place {
  uri: string;
  range: Range;
}

export interface NextEditParams {
  textDocument: { uri: string; version: number };
  position: Position;
  /** Places offered at this version and waved off: the server answers with the one after them. */
  dismissed?: Place[];
}

export function nextEditParams(uri: string, version: number, position: Position, dismissed: Place[] = []): NextEditParams {
  const params: NextEditParams = {
    textDocument: { uri, version },
    position: { line: position.line, character: position.character },
  };
  return dismissed.length ? { ...params, dismissed } : params;
}

/** Where `edit` (answered to a request about `uri`) is, as a place to wave off. */
export function placeOf(edit: NextEdit, uri: string): Place {
  return { uri: edit.textDocument?.uri ?? uri, range: edit.range };
}

function isPosition(value: unknown): value is Position {
  const p = value as Position | undefined;
  return typeof p?.line === 'number' && typeof p?.character === 'number';
}

/** The first edit of a `squidcode/nextEdit` answer, or undefined (none, or not the documented shape). */
export function firstEdit(answer: unknown): NextEdit | undefined {
  const edits = (answer as { edits?: unknown } | null | undefined)?.edits;
  const edit = Array.isArray(edits) ? (edits[0] as Partial<NextEdit> | undefined) : undefined;
  if (!edit || typeof edit.newText !== 'string' || !isPosition(edit.range?.start) || !isPosition(edit.range?.end)) {
    return undefined;
  }
  const command = edit.command;
  const valid = typeof command?.command === 'string' ? command : undefined;
  const document = edit.textDocument;
  const textDocument =
    typeof document?.uri === 'string'
      ? { uri: document.uri, version: typeof document.version === 'number' ? document.version : null }
      : undefined;
  return { range: edit.range, newText: edit.newText, kind: edit.kind, command: valid, textDocument };
}

/** Whether `edit` is in another document than `uri` (the server carried a rename to another file). */
export function inOtherDocument(edit: NextEdit, uri: string): boolean {
  return edit.textDocument !== undefined && !sameUri(edit.textDocument.uri, uri);
}

/** Whether two file URIs name one file (VS Code and the server may percent-encode differently). */
export function sameUri(a: string, b: string): boolean {
  const plain = (uri: string) => {
    try {
      return decodeURIComponent(uri).replace(/^file:\/\/\/([A-Za-z]):/, (_m, d: string) => `file:///${d.toLowerCase()}:`);
    } catch {
      return uri;
    }
  };
  return plain(a) === plain(b);
}

/** The last part of a URI's path (`checkout.py`), to name another file in a hint. */
export function fileName(uri: string): string {
  const path = uri.split('?')[0].split('#')[0];
  const name = path.slice(path.lastIndexOf('/') + 1);
  try {
    return decodeURIComponent(name);
  } catch {
    return name;
  }
}

/** The hint shown at the cursor for an edit in another file: where it is and what it does. */
export function elsewhereText(edit: NextEdit, old: string | undefined): string {
  const where = `${fileName(edit.textDocument?.uri ?? '')}:${edit.range.start.line + 1}`;
  const what = old === undefined ? JSON.stringify(edit.newText) : `${old} → ${edit.newText}`;
  return `  ⇥ ${where}: ${what} (Tab to go there)`;
}

/** Whether `old` can become `now` by insertions alone (`total` -> `subtotal`, `fn` -> `func`): VS
 * Code draws such a change as ghost text; anything else needs a decoration. */
export function insertionsOnly(old: string, now: string): boolean {
  let at = 0;
  for (const ch of now) {
    if (at < old.length && old[at] === ch) {
      at += 1;
    }
  }
  return at === old.length;
}

export type Display = 'inline' | 'decoration';

/** How to show `edit` (replacing `old`) with the cursor on `cursorLine`: inline (ghost text, through
 * the server's inline completion, which answers a next edit on the cursor's line) when VS Code can
 * draw it so, otherwise a decoration at the edit. */
export function displayOf(edit: NextEdit, old: string, cursorLine: number): Display {
  const oneLine = edit.range.start.line === edit.range.end.line && !edit.newText.includes('\n');
  return oneLine && edit.range.start.line === cursorLine && insertionsOnly(old, edit.newText)
    ? 'inline'
    : 'decoration';
}

/** The text a decoration shows after the replaced range: the new text, or for a deletion a mark. */
export function decorationText(edit: NextEdit): string {
  const text = edit.newText.replace(/\n/g, '⏎');
  return text ? ` ${text}` : ' ⌫';
}

/** Where the edit's new text ends once applied (single-line new text; else the line after the range). */
export function endAfterApplying(edit: NextEdit): Position {
  const lines = edit.newText.split('\n');
  if (lines.length === 1) {
    return { line: edit.range.start.line, character: edit.range.start.character + edit.newText.length };
  }
  return { line: edit.range.start.line + lines.length - 1, character: lines[lines.length - 1].length };
}

/** A one-line description for the output channel. */
export function describeNextEdit(edit: NextEdit, old: string): string {
  const at = `${edit.range.start.line + 1}:${edit.range.start.character + 1}`;
  return `next edit at ${at} (${edit.kind ?? 'edit'}): ${JSON.stringify(old)} -> ${JSON.stringify(edit.newText)}`;
}
