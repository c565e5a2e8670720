import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  advertisedCommands,
  agentRunArgs,
  Commands,
  describeAgentResult,
  describeFeedback,
  missingCommandMessage,
} from '../src/protocol';

test('advertised commands come from executeCommandProvider', () => {
  const caps = { executeCommandProvider: { commands: ['squidcode.status', 7, 'squidcode.agent.run'] } };
  assert.deepEqual(advertisedCommands(caps), ['squidcode.status', 'squidcode.agent.run']);
  assert.deepEqual(advertisedCommands({}), []);
  assert.deepEqual(advertisedCommands(undefined), []);
  assert.equal(missingCommandMessage(caps, Commands.agentRun), undefined);
  assert.match(missingCommandMessage({}, Commands.feedbackStatus) ?? '', /does not offer squidcode\.feedback\.status/);
});

test('agent arguments: instruction trimmed, a selection kept, an empty one dropped', () => {
  const range = { start: { line: 1, character: 0 }, end: { line: 3, character: 4 } };
  assert.deepEqual(agentRunArgs('  add a docstring ', 'file:///a.py', range), {
    instruction: 'add a docstring',
    uri: 'file:///a.py',
    range,
  });
  const caret = { start: { line: 2, character: 5 }, end: { line: 2, character: 5 } };
  assert.deepEqual(agentRunArgs('fix it', 'file:///a.py', caret), { instruction: 'fix it', uri: 'file:///a.py' });
  assert.throws(() => agentRunArgs('   ', 'file:///a.py'), /instruction is empty/);
});

test('agent result description lists steps, candidates and the diff', () => {
  const lines = describeAgentResult({
    episodeId: 'e1',
    diff: '--- a\n+++ b\n',
    edit: { changes: {} },
    steps: [{ tool: 'read', args: { path: 'a.py' }, ok: true }, { tool: 'lint', ok: false }],
    candidates: [{ diff: '', verified: true }, { diff: '', verified: false }],
    chosen: 0,
  });
  assert.deepEqual(lines, [
    'agent episode e1',
    '  ok   read {"path":"a.py"}',
    '  fail lint {}',
    '  2 candidate(s), 1 verified, chosen: 0',
    '--- a\n+++ b',
  ]);
  assert.equal(describeAgentResult({ edit: null }).at(-1), '  no edit proposed');
});

test('feedback description', () => {
  assert.equal(
    describeFeedback({ record: true, share: false, storage: 'hashed', episodes: 3, events: 9 }),
    'squidcode feedback: recording (hashed), nothing shared; 3 episode(s), 9 event(s).',
  );
  assert.equal(
    describeFeedback({ record: false, share: true, endpoint: 'https://t', pending_upload: 2 }),
    'squidcode feedback: not recording, sharing with https://t, 2 pending upload.',
  );
});
