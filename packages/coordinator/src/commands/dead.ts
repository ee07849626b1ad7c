/**
 * `tally dead list` and `tally dead replay`: the dead-letter workflow.
 * Flags in, one JSON object or a short table out; the broker work is in
 * dead-queue.ts, the counting in dead-summary.ts.
 */
import type { RedisClient } from '@tally/runtime';
import {
  CliUsageError,
  COUNT_REFUSED,
  layoutKey,
  markerDigest,
  standingCountsOfRecord,
  standingKey,
  statsKey,
  type OperatorCounterName,
  type StandingCounts,
  type TallyConfig,
} from '@tally/shared';
import { listDeadLetters, replayDeadLetters, type ReplayReport } from './dead-queue.js';
import { DeadLetterSummary, parseLimitFlag, parseReasonFlag, type DeadLetterEntry } from './dead-summary.js';
import { forcedLine, markerLifeS, refusedLine, standingLine } from './replay-guard.js';

export interface DeadFlags {
  readonly json?: boolean;
  readonly reason?: string;
  readonly limit?: string;
  /** replay: move dead letters that may have been counted even once their markers may have expired. */
  readonly force?: boolean;
}

/** The exit code of a replay that kept dead letters back for their age (nothing lost: they stay in place, in order). */
export const EXIT_REPLAY_REFUSED = 3;

const FORCED_REPLAYS: OperatorCounterName = 'forced_replays';

/** How many messages `dead list` shows when --limit is not given. */
export const DEFAULT_LIST_LIMIT = 20;

export interface DeadListReport {
  readonly queue: string;
  readonly total: number;
  readonly byReason: Record<string, number>;
  readonly reason: string | null;
  readonly matching: number;
  readonly messages: ReadonlyArray<DeadLetterEntry & { readonly standingSource?: 'header' | 'redis' }>;
  /** Why the standing counts Redis records for count-refused messages were not read (absent: read, or none to read). */
  readonly standingRecordsUnread?: string;
}

/** The standing counts Redis records for a message id (the worker's recordStanding), or null. */
export type RecordedStanding = (id: string) => Promise<StandingCounts | null>;

export function recordedStandingIn(redis: RedisClient, prefix: string): RecordedStanding {
  return async (id) => standingCountsOfRecord(await redis.hgetall(standingKeyOf(prefix, id)));
}

/**
 * Lists the dead letters. A count-refused letter whose header names no
 * standing counts (lost with a dead copy that was never confirmed) shows
 * what Redis records for its message, when `recorded` is given and answers:
 * the record `dead replay` keeps it back for. `unread` says why Redis was
 * not read, for a list that goes on without it.
 */
export async function deadList(
  flags: DeadFlags,
  config: Pick<TallyConfig, 'amqpUrl' | 'deadLetterQueue'> & Partial<Pick<TallyConfig, 'messageMapping'>>,
  recorded: RecordedStanding | { readonly unread: string } | null = null,
): Promise<DeadListReport> {
  const reason = parseReasonFlag(flags.reason);
  const summary = await listDeadLetters(
    { url: config.amqpUrl, deadQueue: config.deadLetterQueue, messageMapping: config.messageMapping ?? null },
    new DeadLetterSummary(reason, parseLimitFlag(flags.limit, DEFAULT_LIST_LIMIT)),
  );
  // Reported only when a letter needed the record: a list of bad messages does not warn about Redis.
  let unread: string | undefined;
  const messages = [];
  for (const message of summary.messages) {
    if (message.standing !== undefined && message.standing !== 'unreadable') {
      messages.push({ ...message, standingSource: 'header' as const });
      continue;
    }
    if (recorded === null || message.reason !== COUNT_REFUSED || message.id === null) {
      messages.push(message);
      continue;
    }
    if (typeof recorded !== 'function' || unread !== undefined) {
      unread ??= typeof recorded === 'function' ? undefined : recorded.unread;
      messages.push(message);
      continue;
    }
    try {
      const record = await recorded(message.id);
      messages.push(record === null ? message : { ...message, standing: record, standingSource: 'redis' as const });
    } catch (error) {
      unread = error instanceof Error ? error.message : String(error);
      messages.push(message);
    }
  }
  return {
    queue: config.deadLetterQueue,
    total: summary.total,
    byReason: summary.byReason,
    reason,
    matching: summary.matching,
    messages,
    ...(unread === undefined ? {} : { standingRecordsUnread: unread }),
  };
}

/**
 * Replays the matching dead letters. Redis is read for the prefix's layout
 * (its virtual shards and marker bucket width: replay-guard.ts markerLifeS)
 * and for the standing counts recorded for each count-refused message, and
 * written for the forced_replays counter, one HINCRBY per forced message
 * before its dead copy is acked. A forced replay drops its message's
 * standing record: the operator has subtracted what stood, and a record
 * left would keep back a later dead letter of it for counts no longer
 * there.
 */
export async function deadReplay(
  flags: DeadFlags,
  config: Pick<TallyConfig, 'amqpUrl' | 'deadLetterQueue' | 'queue' | 'prefix' | 'markerTtlS' | 'virtualShards'> &
    Partial<Pick<TallyConfig, 'messageMapping' | 'partitions'>>,
  redis: RedisClient,
): Promise<ReplayReport> {
  const reason = parseReasonFlag(flags.reason);
  const limit = parseLimitFlag(flags.limit, Number.MAX_SAFE_INTEGER);
  const [bucketS, shards] = await redis.hmget(layoutKey(config.prefix), 'marker_bucket_s', 'virtual_shards');
  const recordedShards = shards === null ? NaN : Number(shards);
  return replayDeadLetters({
    url: config.amqpUrl,
    deadQueue: config.deadLetterQueue,
    messageMapping: config.messageMapping ?? null,
    queue: config.queue,
    partitions: config.partitions,
    reason,
    limit,
    policy: {
      markerLifeS: markerLifeS(config.markerTtlS, bucketS === null ? null : Number(bucketS)),
      force: flags.force === true,
      virtualShards: Number.isSafeInteger(recordedShards) && recordedShards > 0 ? recordedShards : config.virtualShards,
      messageMapping: config.messageMapping ?? null,
    },
    recordedStanding: recordedStandingIn(redis, config.prefix),
    onForced: async (entry) => {
      await redis.hincrby(statsKey(config.prefix), FORCED_REPLAYS, 1);
      if (entry.reason === COUNT_REFUSED && entry.id !== null) await redis.del(standingKeyOf(config.prefix, entry.id));
    },
  });
}

function standingKeyOf(prefix: string, id: string): string {
  return standingKey(prefix, markerDigest(id).toString('hex'));
}

/** The line for stderr after a replay: what was kept back for its age, or what --force replayed anyway; null when neither. */
export function deadReplayWarning(report: ReplayReport): string | null {
  const life = report.markerLifeS ?? 0;
  const lines: string[] = [];
  if (report.refused.messages > 0) lines.push(refusedLine(report.refused, life));
  const standing = standingLine(report.refused);
  if (standing !== null) lines.push(standing);
  if (report.forced.messages > 0) lines.push(forcedLine(report.forced, life));
  if (report.withoutPartition > 0)
    lines.push(
      `kept ${report.withoutPartition} dead letter${report.withoutPartition === 1 ? '' : 's'} that name no partition queue of ${report.queue} to return to ` +
        `(no x-tally-source-queue or x-death queue among ${report.queue}.0…): move them by hand to the partition their id hashes to, or publish them to the exchange ${report.queue} with the id as routing key`,
    );
  return lines.length === 0 ? null : lines.join('\n');
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
    for (const m of report.messages) {
      lines.push(`  ${m.position}\t${m.id ?? '(no id)'}\t${m.reason}${m.detail ? `: ${m.detail}` : ''}`);
      if (m.standing !== undefined)
        lines.push(
          `  \tstanding on another count shard, to subtract before a replay: ${m.standing === 'unreadable' ? 'unreadable header' : JSON.stringify(m.standing)}${m.standingSource === 'redis' ? ' (recorded in Redis; the header has none)' : ''}`,
        );
    }
  }
  if (report.standingRecordsUnread !== undefined)
    lines.push(`standing counts recorded in Redis not read (${report.standingRecordsUnread}): only the letters' headers name them here`);
  return lines.join('\n');
}

export function deadReplayText(report: ReplayReport): string {
  const refused =
    report.refused.messages > 0 || report.withoutPartition > 0
      ? ` (${[report.refused.messages > 0 ? `${report.refused.messages} of them refused for their age${report.refused.standingMessages > 0 ? ' or counts that stand' : ''}` : '', report.withoutPartition > 0 ? `${report.withoutPartition} naming no partition` : ''].filter(Boolean).join(', ')})`
      : '';
  const forced = report.forced.messages > 0 ? ` (${report.forced.messages} of them FORCED past their markers)` : '';
  const lines = [`replayed ${report.replayed}${forced} from ${report.deadQueue} to ${report.queue}; ${report.kept} read and kept in place${refused}`];
  lines.push(...table(Object.entries(report.replayedByReason)).map((line) => `  ${line}`));
  return lines.join('\n');
}

export function deadSubcommand(raw: string | undefined): 'list' | 'replay' {
  if (raw === 'list' || raw === 'replay') return raw;
  throw new CliUsageError(`dead: expected "list" or "replay", got ${JSON.stringify(raw ?? '')}`);
}
