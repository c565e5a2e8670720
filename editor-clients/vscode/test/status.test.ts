import assert from 'node:assert/strict';
import { test } from 'node:test';

import { statusBarView } from '../src/status';

test('before any status: starting', () => {
  const view = statusBarView(undefined);
  assert.equal(view.severity, 'busy');
  assert.match(view.text, /sync~spin/);
});

test('model loading, then loaded with the index ready', () => {
  const loading = statusBarView({ version: '0.1.0', model: { name: 'SmolLM2-135M-Instruct', loaded: false } });
  assert.equal(loading.text, '$(sync~spin) squidcode: loading model');
  const ready = statusBarView({
    version: '0.1.0',
    model: { name: 'SmolLM2-135M-Instruct', loaded: true, device: 'cpu', dtype: 'float32' },
    index: { state: 'ready', files: 3, symbols: 12 },
    feedback: { record: true, share: false },
  });
  assert.equal(ready.text, '$(check) squidcode: SmolLM2-135M-Instruct');
  assert.equal(ready.severity, 'ok');
  assert.match(ready.tooltip, /model: SmolLM2-135M-Instruct \(loaded, cpu, float32\)/);
  assert.match(ready.tooltip, /index: ready: 3 files, 12 symbols/);
  assert.match(ready.tooltip, /feedback: recording, not shared/);
});

test('indexing and training show, and a newer indexStatus wins over the status object', () => {
  const status = {
    model: { name: '/models/qwen2.5-coder-1.5b/', loaded: true, adapter: 'a1' },
    index: { state: 'ready' },
    training: { state: 'training', step: 7 },
  };
  const view = statusBarView(status, { state: 'indexing', files: 1 });
  assert.equal(view.text, '$(sync~spin) squidcode: qwen2.5-coder-1.5b+adapter · indexing · training 7');
  assert.match(view.tooltip, /adapter: a1/);
});

test('a model error is an error', () => {
  const view = statusBarView({ model: { name: 'x', loaded: false, error: 'model.path /x does not exist.' } });
  assert.equal(view.severity, 'error');
  assert.equal(view.text, '$(error) squidcode: model failed');
  assert.match(view.tooltip, /error: model.path \/x does not exist\./);
});
