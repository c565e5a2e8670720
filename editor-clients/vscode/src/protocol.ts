// squidcode's LSP extensions (docs/protocol.md), as the client sees them. No `vscode` import: the
// pure modules are unit-tested in plain node.

export const Commands = {
  status: 'squidcode.status',
  agentRun: 'squidcode.agent.run',
  agentApplied: 'squidcode.agent.applied',
  completionAccept: 'squidcode.completion.accept',
  feedbackStatus: 'squidcode.feedback.status',
  feedbackSetRecord: 'squidcode.feedback.setRecord',
  feedbackSetShare: 'squidcode.feedback.setShare',
} as const;

export const Notifications = {
  status: 'squidcode/status',
  indexStatus: 'squidcode/indexStatus',
} as const;

export interface ModelStatus {
  name?: string;
  loaded?: boolean;
  device?: string;
  dtype?: string;
  adapter?: string | null;
  error?: string | null;
}

export interface IndexStatus {
  state?: string;
  files?: number;
  chunks?: number;
  symbols?: number;
  error?: string | null;
}

export interface ServerStatus {
  version?: string;
  model?: ModelStatus;
  index?: IndexStatus;
  feedback?: { record?: boolean; share?: boolean };
  training?: { state?: string; adapter?: string | null; step?: number | null };
}

export interface FeedbackStatus {
  record: boolean;
  share: boolean;
  storage?: string;
  db?: string;
  episodes?: number;
  events?: number;
  pending_upload?: number;
  endpoint?: string | null;
}

export interface Position { line: number; character: number }
export interface Range { start: Position; end: Position }

export interface AgentRunArgs {
  instruction: string;
  uri: string;
  range?: Range;
  k?: number;
  apply?: boolean;
}

export interface AgentRunResult {
  episodeId?: string;
  diff?: string;
  edit?: unknown | null;
  steps?: { tool: string; args?: unknown; ok: boolean }[];
  candidates?: { diff: string; verified: boolean; checks?: unknown }[];
  chosen?: number | null;
}

/** The commands the server lists in `executeCommandProvider` (none when it lists nothing). */
export function advertisedCommands(capabilities: unknown): string[] {
  const provider = (capabilities as { executeCommandProvider?: { commands?: unknown } } | undefined)
    ?.executeCommandProvider;
  const commands = provider?.commands;
  return Array.isArray(commands) ? commands.filter((c): c is string => typeof c === 'string') : [];
}

/** A message for the user when the server does not offer `command`, or undefined when it does. */
export function missingCommandMessage(capabilities: unknown, command: string): string | undefined {
  if (advertisedCommands(capabilities).includes(command)) {
    return undefined;
  }
  return `This squidcode server does not offer ${command}: update squidcode (\`pip install -U squidcode\`) ` +
    'or check `squidcode doctor`.';
}

/** The arguments of `squidcode.agent.run` for an instruction on a selection (none: the whole file). */
export function agentRunArgs(instruction: string, uri: string, range?: Range): AgentRunArgs {
  const trimmed = instruction.trim();
  if (!trimmed) {
    throw new Error('The instruction is empty: say what the agent should do.');
  }
  const args: AgentRunArgs = { instruction: trimmed, uri };
  const empty = range && range.start.line === range.end.line && range.start.character === range.end.character;
  if (range && !empty) {
    args.range = range;
  }
  return args;
}

/** Lines for the output channel that say what the agent did. */
export function describeAgentResult(result: AgentRunResult): string[] {
  const lines: string[] = [`agent episode ${result.episodeId ?? '(none)'}`];
  for (const step of result.steps ?? []) {
    lines.push(`  ${step.ok ? 'ok  ' : 'fail'} ${step.tool} ${JSON.stringify(step.args ?? {})}`);
  }
  const candidates = result.candidates ?? [];
  if (candidates.length) {
    const verified = candidates.filter((c) => c.verified).length;
    lines.push(`  ${candidates.length} candidate(s), ${verified} verified, chosen: ${result.chosen ?? 'none'}`);
  }
  lines.push(result.edit ? (result.diff ?? '').trimEnd() : '  no edit proposed');
  return lines;
}

/** The one-line answer to "feedback status" for a notification. */
export function describeFeedback(status: FeedbackStatus): string {
  const record = status.record ? `recording (${status.storage ?? 'full'})` : 'not recording';
  const share = status.share ? `sharing with ${status.endpoint ?? 'the team endpoint'}` : 'nothing shared';
  const counts = status.episodes === undefined ? '' : `; ${status.episodes} episode(s), ${status.events ?? 0} event(s)`;
  const pending = status.pending_upload ? `, ${status.pending_upload} pending upload` : '';
  return `squidcode feedback: ${record}, ${share}${counts}${pending}.`;
}
