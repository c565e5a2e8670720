// What the status bar item shows, from `squidcode/status` and `squidcode/indexStatus`.

import type { IndexStatus, ServerStatus } from './protocol';

export interface StatusBarView {
  text: string;
  tooltip: string;
  /** 'error' when the model failed to load: the item takes the error colour. */
  severity: 'ok' | 'busy' | 'error';
}

function shortName(name: string | undefined): string {
  if (!name) {
    return 'model';
  }
  const base = name.replace(/[\\/]+$/, '').split(/[\\/]/).pop() ?? name;
  return base.length > 28 ? base.slice(0, 27) + '…' : base;
}

/** The status bar item for a status object; `index` (from indexStatus) wins over status.index. */
export function statusBarView(status: ServerStatus | undefined, index?: IndexStatus): StatusBarView {
  if (!status) {
    return { text: '$(sync~spin) squidcode', tooltip: 'squidcode: starting the server', severity: 'busy' };
  }
  const model = status.model ?? {};
  const idx = index ?? status.index ?? {};
  const parts: string[] = [];
  let severity: StatusBarView['severity'] = 'ok';
  let icon = '$(check)';
  if (model.error) {
    severity = 'error';
    icon = '$(error)';
    parts.push('model failed');
  } else if (!model.loaded) {
    severity = 'busy';
    icon = '$(sync~spin)';
    parts.push('loading model');
  } else {
    parts.push(shortName(model.name) + (model.adapter ? '+adapter' : ''));
  }
  if (idx.state === 'indexing' || idx.state === 'starting') {
    if (severity === 'ok') {
      icon = '$(sync~spin)';
      severity = 'busy';
    }
    parts.push('indexing');
  }
  const training = status.training?.state;
  if (training && training !== 'off' && training !== 'idle') {
    parts.push(`training${status.training?.step != null ? ' ' + status.training.step : ''}`);
  }
  return { text: `${icon} squidcode: ${parts.join(' · ')}`, tooltip: statusTooltip(status, idx), severity };
}

/** Multi-line tooltip: everything the status object says. */
export function statusTooltip(status: ServerStatus, index: IndexStatus): string {
  const model = status.model ?? {};
  const lines = [
    `squidcode ${status.version ?? ''}`.trim(),
    `model: ${model.name ?? '?'} (${model.loaded ? 'loaded' : model.error ? 'failed' : 'loading'}` +
      `${model.device ? ', ' + model.device : ''}${model.dtype ? ', ' + model.dtype : ''})`,
  ];
  if (model.adapter) {
    lines.push(`adapter: ${model.adapter}`);
  }
  if (model.error) {
    lines.push(`error: ${model.error}`);
  }
  const counts = index.files === undefined ? '' : `: ${index.files} files, ${index.symbols ?? 0} symbols`;
  lines.push(`index: ${index.state ?? 'off'}${counts}`);
  const feedback = status.feedback ?? {};
  lines.push(`feedback: ${feedback.record ? 'recording' : 'not recording'}, ${feedback.share ? 'sharing' : 'not shared'}`);
  if (status.training?.state) {
    lines.push(`training: ${status.training.state}${status.training.step != null ? ` (step ${status.training.step})` : ''}`);
  }
  return lines.join('\n');
}
