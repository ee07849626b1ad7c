/**
 * `tally dead list` and `tally dead replay`: the dead-letter workflow.
 * Flags in, one JSON object or a short table out; the broker work is in
 * dead-queue.ts, the counting in dead-summary.ts.
 */
import { CliUsageError, type TallyConfig } from '@tally/shared';
import { listDeadLetters, replayDeadLetters, type ReplayReport } from './dead-queue.js';
import { DeadLetterSummary, parseLimitFlag, parseReasonFlag } from './dead-summary.js';

export interface DeadFlags {
  readonly json?: boolean;
  readonly reason?: string;
  readonly limit?: string;
}

/** How many messages `dead list` shows when --limit is not given. */
export const DEFAULT_LIST_LIMIT = 20;

export interface DeadListReport {
  readonly queue: string;
  readonly total: number;
  readonly byReason: Record<string, number>;
  readonly reason: string | null;
  readonly matching: number;
  readonly messages: DeadLetterSummary['messages'];
}

export async function deadList(flags: DeadFlags, config: Pick<TallyConfig, 'amqpUrl' | 'deadLetterQueue'>): Promise<DeadListReport> {
  const reason = parseReasonFlag(flags.reason);
  const summary = await listDeadLetters(
    { url: config.amqpUrl, deadQueue: config.deadLetterQueue },
    new DeadLetterSummary(reason, parseLimitFlag(flags.limit, DEFAULT_LIST_LIMIT)),
  );
  return { queue: config.deadLetterQueue, total: summary.total, byReason: summary.byReason, reason, matching: summary.matching, messages: summary.messages };
}

export async function deadReplay(flags: DeadFlags, config: Pick<TallyConfig, 'amqpUrl' | 'deadLetterQueue' | 'queue'>): Promise<ReplayReport> {
  return replayDeadLetters({
    url: config.amqpUrl,
    deadQueue: config.deadLetterQueue,
    queue: config.queue,
    reason: parseReasonFlag(flags.reason),
    limit: parseLimitFlag(flags.limit, Number.MAX_SAFE_INTEGER),
  });
}

function table(rows: ReadonlyArray<readonly [string, string | number]>): string[] {
  const width = Math.max(0, ...rows.map(([name]) => name.length));
  return rows.map(([name, value]) => `${name.padEnd(width)}  ${value}`);
}

export function deadListText(report: DeadListReport): string {
  const lines = [`${report.queue}: ${report.total} dead letter${report.total === 1 ? '' : 's'}`];
  lines.push(...table(Object.entries(report.byReason).sort(([, a], [, b]) => b - a)).map((line) => `  ${line}`));
  if (report.messages.length > 0) {
    lines.push(`first ${report.messages.length} of ${report.matching}${report.reason ? ` with reason ${report.reason}` : ''} (position, id, reason: detail):`);
    for (const m of report.messages) lines.push(`  ${m.position}\t${m.id ?? '(no id)'}\t${m.reason}${m.detail ? `: ${m.detail}` : ''}`);
  }
  return lines.join('\n');
}

export function deadReplayText(report: ReplayReport): string {
  const lines = [`replayed ${report.replayed} from ${report.deadQueue} to ${report.queue}; ${report.kept} read and kept in place`];
  lines.push(...table(Object.entries(report.replayedByReason)).map((line) => `  ${line}`));
  return lines.join('\n');
}

export function deadSubcommand(raw: string | undefined): 'list' | 'replay' {
  if (raw === 'list' || raw === 'replay') return raw;
  throw new CliUsageError(`dead: expected "list" or "replay", got ${JSON.stringify(raw ?? '')}`);
}
