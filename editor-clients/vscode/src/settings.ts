// VS Code settings -> the server's settings (the shape of .squidcode.toml). Only the settings the
// user has set go to the server, so the server's own defaults and config files stay in charge of
// everything else.

/** One setting: its value, and whether the user set it (any scope) rather than it being the default. */
export interface SettingValue<T = unknown> {
  value: T;
  explicit: boolean;
}

export type ReadSetting = (key: string) => SettingValue;

type Tree = Record<string, unknown>;

function put(tree: Tree, path: string[], value: unknown): void {
  let node = tree;
  for (const key of path.slice(0, -1)) {
    if (typeof node[key] !== 'object' || node[key] === null) {
      node[key] = {};
    }
    node = node[key] as Tree;
  }
  node[path[path.length - 1]] = value;
}

function mergeInto(target: Tree, source: unknown): void {
  if (typeof source !== 'object' || source === null || Array.isArray(source)) {
    return;
  }
  for (const [key, value] of Object.entries(source)) {
    if (typeof value === 'object' && value !== null && !Array.isArray(value)) {
      if (typeof target[key] !== 'object' || target[key] === null) {
        target[key] = {};
      }
      mergeInto(target[key] as Tree, value);
    } else {
      target[key] = value;
    }
  }
}

// VS Code setting (under `squidcode.`) -> server setting path.
const MAPPED: [string, string[]][] = [
  ['model.path', ['model', 'path']],
  ['model.device', ['model', 'device']],
  ['model.dtype', ['model', 'dtype']],
  ['completion.enabled', ['completion', 'enabled']],
  ['completion.debounceMs', ['completion', 'debounce_ms']],
  ['completion.backend', ['completion', 'backend']],
  ['completion.serverUrl', ['completion', 'server_url']],
  ['feedback.record', ['feedback', 'record']],
  ['feedback.share', ['feedback', 'share']],
];

/** The server settings object for the user's explicit VS Code settings. */
export function toServerSettings(read: ReadSetting): Tree {
  const out: Tree = {};
  // The free-form object first: the named settings below win over it.
  mergeInto(out, read('serverSettings').value);
  for (const [key, path] of MAPPED) {
    const setting = read(key);
    if (!setting.explicit || setting.value === null || setting.value === undefined) {
      continue; // unset (null): the server's own value
    }
    if ((key === 'model.path' || key === 'completion.serverUrl') && !setting.value) {
      continue; // empty = the server's own value (for model.path: the embedded model)
    }
    put(out, path, setting.value);
  }
  const url = read('backend.url');
  if (url.explicit && typeof url.value === 'string' && url.value.trim()) {
    put(out, ['agent', 'backend'], 'openai');
    put(out, ['agent', 'base_url'], url.value.trim());
  }
  return out;
}

/** The server command line from `squidcode.server.command`, checked. */
export function serverCommand(value: unknown): { command: string; args: string[] } {
  const parts = typeof value === 'string' ? value.trim().split(/\s+/) : value;
  if (!Array.isArray(parts) || parts.length === 0 || !parts.every((p) => typeof p === 'string' && p)) {
    throw new Error('squidcode.server.command must be a non-empty list of strings, e.g. ["squidcode", "serve"].');
  }
  return { command: parts[0], args: parts.slice(1) };
}
