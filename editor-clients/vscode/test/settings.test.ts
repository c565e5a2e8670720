import assert from 'node:assert/strict';
import { test } from 'node:test';

import { type ReadSetting, serverCommand, toServerSettings } from '../src/settings';

function reader(explicit: Record<string, unknown>, defaults: Record<string, unknown> = {}): ReadSetting {
  return (key) =>
    key in explicit ? { value: explicit[key], explicit: true } : { value: defaults[key], explicit: false };
}

test('only settings the user set reach the server, under the server names', () => {
  const out = toServerSettings(
    reader(
      { 'model.device': 'cuda', 'completion.debounceMs': 80, 'feedback.record': true },
      { 'model.dtype': 'auto', 'completion.enabled': true, serverSettings: {} },
    ),
  );
  assert.deepEqual(out, { model: { device: 'cuda' }, completion: { debounce_ms: 80 }, feedback: { record: true } });
});

test('a feedback setting set back to null is the server\'s own value again', () => {
  assert.deepEqual(toServerSettings(reader({ 'feedback.record': null, 'feedback.share': false })), {
    feedback: { share: false },
  });
});

test('nothing set sends an empty object (the server keeps its defaults and files)', () => {
  assert.deepEqual(toServerSettings(reader({}, { serverSettings: {} })), {});
});

test('an empty model path means the embedded model and is not sent', () => {
  assert.deepEqual(toServerSettings(reader({ 'model.path': '' })), {});
  assert.deepEqual(toServerSettings(reader({ 'model.path': '/m' })), { model: { path: '/m' } });
});

test('a backend URL selects the OpenAI-compatible agent backend', () => {
  assert.deepEqual(toServerSettings(reader({ 'backend.url': ' http://gpu:8000/v1 ' })), {
    agent: { backend: 'openai', base_url: 'http://gpu:8000/v1' },
  });
  assert.deepEqual(toServerSettings(reader({ 'backend.url': '   ' })), {});
});

test('serverSettings pass through and named settings win over them', () => {
  const out = toServerSettings(
    reader({
      serverSettings: { completion: { max_tokens: 48, debounce_ms: 5 }, index: { enabled: false } },
      'completion.debounceMs': 60,
    }),
  );
  assert.deepEqual(out, { completion: { max_tokens: 48, debounce_ms: 60 }, index: { enabled: false } });
});

test('a non-object serverSettings is ignored', () => {
  assert.deepEqual(toServerSettings(reader({ serverSettings: 'oops' })), {});
});

test('server command: list, string, and bad values', () => {
  assert.deepEqual(serverCommand(['/v/bin/squidcode', 'serve']), { command: '/v/bin/squidcode', args: ['serve'] });
  assert.deepEqual(serverCommand('squidcode  serve'), { command: 'squidcode', args: ['serve'] });
  assert.throws(() => serverCommand([]), /non-empty list of strings/);
  assert.throws(() => serverCommand(['squidcode', 3]), /non-empty list of strings/);
  assert.throws(() => serverCommand(undefined), /non-empty list of strings/);
});

test('a team completion server: backend and URL under the server names, an empty URL not sent', () => {
  assert.deepEqual(
    toServerSettings(reader({ 'completion.backend': 'llama-server', 'completion.serverUrl': 'http://gpu:8080' })),
    { completion: { backend: 'llama-server', server_url: 'http://gpu:8080' } },
  );
  assert.deepEqual(toServerSettings(reader({ 'completion.serverUrl': '' })), {});
});
