import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  decorationText,
  describeNextEdit,
  displayOf,
  elsewhereText,
  endAfterApplying,
  fileName,
  firstEdit,
  inOtherDocument,
  insertionsOnly,
  type NextEdit,
  nextEditParams,
  placeOf,
} from '../src/nextEdit';

const at = (line: number, start: number, end: number) => ({
  start: { line, character: start },
  end: { line, character: end },
});

const command = { title: 'squidcode: accept', command: 'squidcode.completion.accept', arguments: [{ episodeId: 'e1' }] };

test('the request names the versioned document and the cursor', () => {
  assert.deepEqual(nextEditParams('file:///a.py', 7, { line: 3, character: 9 }), {
    textDocument: { uri: 'file:///a.py', version: 7 },
    position: { line: 3, character: 9 },
  });
});

test('places waved off go with the request, each where its edit is', () => {
  const here = { range: at(3, 8, 13), newText: 'subtotal' };
  const there = { range: at(0, 20, 26), newText: 'summary', textDocument: { uri: 'file:///b.py', version: null } };
  const waved = [placeOf(here, 'file:///a.py'), placeOf(there, 'file:///a.py')];
  assert.deepEqual(waved, [{ uri: 'file:///a.py', range: at(3, 8, 13) }, { uri: 'file:///b.py', range: at(0, 20, 26) }]);
  assert.deepEqual(nextEditParams('file:///a.py', 7, { line: 3, character: 9 }, waved), {
    textDocument: { uri: 'file:///a.py', version: 7 },
    position: { line: 3, character: 9 },
    dismissed: waved,
  });
});

test('the first edit of an answer, its command kept; nothing from an empty or malformed answer', () => {
  const edit = { range: at(3, 8, 13), newText: 'subtotal', kind: 'rename', command, textDocument: { uri: 'u' } };
  assert.deepEqual(firstEdit({ edits: [edit] }), {
    range: at(3, 8, 13), newText: 'subtotal', kind: 'rename', command, textDocument: { uri: 'u', version: null },
  });
  assert.equal(firstEdit({ edits: [] }), undefined);
  assert.equal(firstEdit(null), undefined);
  assert.equal(firstEdit({ edits: [{ range: at(1, 0, 1) }] }), undefined); // no newText
  assert.equal(firstEdit({ edits: [{ range: { start: { line: 1 } }, newText: 'x' }] }), undefined);
  // A command without its name is dropped, not passed on to be run.
  assert.equal(firstEdit({ edits: [{ range: at(1, 0, 1), newText: 'x', command: { title: 't' } }] })?.command, undefined);
});

test('insertions alone: ghost text can draw them', () => {
  assert.equal(insertionsOnly('total', 'subtotal'), true);
  assert.equal(insertionsOnly('fn', 'func'), true);
  assert.equal(insertionsOnly('', ', timeout=5'), true);
  assert.equal(insertionsOnly('start', 'initial'), false);
  assert.equal(insertionsOnly('x', ''), false);
});

test('inline on the cursor line when VS Code can draw it, a decoration otherwise', () => {
  const rename: NextEdit = { range: at(3, 8, 13), newText: 'subtotal' };
  assert.equal(displayOf(rename, 'total', 3), 'inline');
  assert.equal(displayOf(rename, 'total', 2), 'decoration'); // another line
  assert.equal(displayOf({ range: at(3, 8, 13), newText: 'initial' }, 'start', 3), 'decoration');
  const multiline = { range: { start: { line: 3, character: 0 }, end: { line: 4, character: 0 } }, newText: 'a\n' };
  assert.equal(displayOf(multiline, 'b\n', 3), 'decoration');
});

test('the decoration text, where the cursor goes after applying, the log line', () => {
  assert.equal(decorationText({ range: at(0, 0, 1), newText: 'subtotal' }), ' subtotal');
  assert.equal(decorationText({ range: at(0, 0, 1), newText: '' }), ' ⌫');
  assert.deepEqual(endAfterApplying({ range: at(4, 11, 16), newText: 'subtotal' }), { line: 4, character: 19 });
  assert.deepEqual(endAfterApplying({ range: at(4, 11, 16), newText: 'a\nbc' }), { line: 5, character: 2 });
  assert.equal(
    describeNextEdit({ range: at(3, 8, 13), newText: 'subtotal', kind: 'rename' }, 'total'),
    'next edit at 4:9 (rename): "total" -> "subtotal"',
  );
});

test('an edit in another file is told apart from one in this file, however the URI is encoded', () => {
  const there: NextEdit = { range: at(0, 32, 37), newText: 'subtotal', textDocument: { uri: 'file:///w/shop/checkout.py' } };
  assert.equal(inOtherDocument(there, 'file:///w/shop/report.py'), true);
  assert.equal(inOtherDocument(there, 'file:///w/shop/checkout.py'), false);
  const spaced: NextEdit = { ...there, textDocument: { uri: 'file:///w/my%20shop/c.py' } };
  assert.equal(inOtherDocument(spaced, 'file:///w/my shop/c.py'), false);
  assert.equal(inOtherDocument({ ...there, textDocument: { uri: 'file:///C:/w/c.py' } }, 'file:///c%3A/w/c.py'), false);
  assert.equal(inOtherDocument({ range: at(0, 0, 1), newText: 'x' }, 'file:///w/a.py'), false); // unnamed: this one
  assert.equal(fileName('file:///w/my%20shop/check%20out.py'), 'check out.py');
  assert.equal(elsewhereText(there, 'total'), '  ⇥ checkout.py:1: total → subtotal (Tab to go there)');
  assert.equal(elsewhereText(there, undefined), '  ⇥ checkout.py:1: "subtotal" (Tab to go there)');
});
