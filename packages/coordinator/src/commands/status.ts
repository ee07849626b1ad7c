/**
 * `tally status [--json]`: the live daemons of the prefix (from their
 * heartbeats), the prefix's layout, and the queue as the broker sees it.
 * With TALLY_PARTITIONS > 1 it also lists each partition: its queue's depth
 * and consumers as the broker sees them and the daemon(s) holding it as
 * their heartbeats say (two during a handoff, none when it is unconsumed).
 * A prefix nobody has started on is an empty list, not an error; a broker
 * that cannot be reached is shown as such, and the daemons are still listed.
 */
import type amqp from 'amqplib';
import type { Redis } from 'ioredis';
import {
  describeError,
  failoverFlags,
  isSentinelUrl,
  layoutKey,
  markerScopeOf,
  fencedAdoptionOf,
  parseSentinelUrl,
  partitionQueues,
  type MarkerScope,
  type TallyConfig,
  type TallyMode,
} from '@tally/shared';
import { askSentinels, scanNodes, type RedisClient } from '@tally/runtime';
import { connectAnyNode } from '../amqp/broker-connect.js';
import { listDaemons, type LiveDaemon } from '../fleet/heartbeat.js';
import { readStreamStatus, type StreamPartitionStatus } from './stream-status.js';
import { withCliRedis } from '../redis/cli-redis.js';

export interface LayoutStatus {
  readonly virtual_shards: number;
  readonly mode: TallyMode;
  readonly created_at: string | null;
  /** TALLY_PARTITIONS recorded for the prefix (1 for a layout from before partitions). */
  readonly partitions: number;
  /** The recorded marker format (markers.ts), null for a layout from before it was recorded. */
  readonly marker_format: string | null;
  /** What one marker stands for: `message` or `part` (markers.ts MarkerScope); null for a format this build does not write. */
  readonly marker_scope: MarkerScope | null;
}

/** One partition (TALLY_PARTITIONS > 1). */
export interface PartitionStatus {
  readonly partition: number;
  readonly queue: string;
  /** Ready messages; null when the queue does not exist or the broker could not be asked. */
  readonly depth: number | null;
  /** Consumers subscribed (the active one and those waiting behind it: single active consumer). */
  readonly consumers: number | null;
  /** Ids of the live daemons whose heartbeat lists it: one normally, two mid-handoff, none when nobody consumes it. */
  readonly held_by: string[];
}

export interface QueueStatus {
  readonly name: string;
  /** null when the broker could not be asked. */
  readonly exists: boolean | null;
  /** Ready messages (not those delivered and unacked). */
  readonly depth: number | null;
  readonly consumers: number | null;
  readonly dead_letter_queue: string;
  readonly dead_depth: number | null;
  readonly error?: string;
}

/** Behind Sentinel (redis+sentinel://): the primary as the Sentinels name it. */
export interface SentinelStatus {
  /** The master group name. */
  readonly master: string;
  /** `host:port`; null when no Sentinel answered. */
  readonly primary: string | null;
  readonly flags: string[];
  readonly failover_in_progress: boolean;
  /** Replicas and Sentinels the answering Sentinel knows. */
  readonly replicas: number | null;
  readonly sentinels: number | null;
  /** The Sentinel that answered. */
  readonly sentinel: string | null;
  readonly error?: string;
}

export interface StatusReport {
  readonly prefix: string;
  /** Behind Sentinel: the current primary and any failover in progress; null for a Redis named directly. */
  readonly sentinel: SentinelStatus | null;
  readonly layout: LayoutStatus | null;
  readonly queue: QueueStatus;
  readonly daemons: LiveDaemon[];
  /** Empty with one queue, and with streams (see `streams`). */
  readonly partitions: PartitionStatus[];
  /** TALLY_SOURCE=stream: each partition's stream, checkpoint and lag (stream-status.ts); empty for a queue. */
  readonly streams: StreamPartitionStatus[];
}

export async function readLayout(redis: RedisClient, prefix: string): Promise<LayoutStatus | null> {
  const stored = await redis.hgetall(layoutKey(prefix));
  if (stored.virtual_shards === undefined) return null;
  return {
    virtual_shards: Number(stored.virtual_shards),
    mode: stored.mode === 'atomic' ? 'atomic' : 'two-step',
    created_at: stored.created_at ?? null,
    partitions: stored.partitions === undefined ? 1 : Number(stored.partitions),
    marker_format: stored.marker_format ?? null,
    marker_scope: stored.marker_format === undefined ? null : markerScopeOf(stored.marker_format),
  };
}

/** Depth and consumers of a queue by a passive declare; null when it does not exist. */
async function checkQueue(connection: amqp.ChannelModel, queue: string): Promise<{ messageCount: number; consumerCount: number } | null> {
  // A passive declare of a missing queue closes its channel: one channel per check.
  const channel = await connection.createChannel();
  channel.on('error', () => {});
  try {
    return await channel.checkQueue(queue);
  } catch (error) {
    if (/NOT_FOUND/.test(error instanceof Error ? error.message : String(error))) return null;
    throw error;
  } finally {
    await channel.close().catch(() => {});
  }
}

type QueueDepth = { messageCount: number; consumerCount: number } | null;

export async function readQueueStatus(
  config: Pick<TallyConfig, 'amqpNodes' | 'queue' | 'deadLetterQueue'> & Partial<Pick<TallyConfig, 'partitions'>>,
  partitionDepths: QueueDepth[] = [],
): Promise<QueueStatus> {
  const base = { name: config.queue, dead_letter_queue: config.deadLetterQueue };
  let connection: amqp.ChannelModel;
  try {
    ({ model: connection } = await connectAnyNode(config.amqpNodes, 'tally-cli-status'));
  } catch (error) {
    return { ...base, exists: null, depth: null, consumers: null, dead_depth: null, error: `unreachable: ${describeError(error)}` };
  }
  connection.on('error', () => {});
  try {
    const partitions = config.partitions ?? 1;
    // Partitioned: TALLY_QUEUE is the exchange; its queues are counted together here and listed one by one.
    const work = partitions === 1 ? await checkQueue(connection, config.queue) : await sumQueues(connection, config.queue, partitions, partitionDepths);
    const dead = await checkQueue(connection, config.deadLetterQueue);
    return {
      ...base,
      exists: work !== null,
      depth: work?.messageCount ?? null,
      consumers: work?.consumerCount ?? null,
      dead_depth: dead?.messageCount ?? null,
    };
  } finally {
    await connection.close().catch(() => {});
  }
}

/** The partition queues' depths (into `depths`, in partition order) and their sum; null when none exists. */
async function sumQueues(connection: amqp.ChannelModel, queue: string, partitions: number, depths: QueueDepth[]): Promise<QueueDepth> {
  let found = false;
  const sum = { messageCount: 0, consumerCount: 0 };
  for (const name of partitionQueues(queue, partitions)) {
    const one = await checkQueue(connection, name);
    depths.push(one);
    if (one === null) continue;
    found = true;
    sum.messageCount += one.messageCount;
    sum.consumerCount += one.consumerCount;
  }
  return found ? sum : null;
}

/** Each partition with its depth and its holders (pure: from what the broker and the heartbeats said). */
export function partitionStatus(queue: string, partitions: number, depths: readonly QueueDepth[], daemons: readonly LiveDaemon[]): PartitionStatus[] {
  if (partitions <= 1) return [];
  return partitionQueues(queue, partitions).map((name, partition) => ({
    partition,
    queue: name,
    depth: depths[partition]?.messageCount ?? null,
    consumers: depths[partition]?.consumerCount ?? null,
    held_by: daemons.filter((d) => d.queue === queue && d.partitions.includes(partition)).map((d) => d.id),
  }));
}

/** What the Sentinels say of the master now; a Sentinel that cannot be reached is shown as such. */
export async function readSentinelStatus(redisUrl: string): Promise<SentinelStatus> {
  const target = parseSentinelUrl(redisUrl);
  try {
    const { sentinel, master } = await askSentinels(target);
    return {
      master: target.masterName,
      primary: master.address,
      flags: [...master.flags],
      failover_in_progress: failoverFlags(master.flags).length > 0,
      replicas: master.replicas,
      sentinels: master.sentinels,
      sentinel,
    };
  } catch (error) {
    return {
      master: target.masterName,
      primary: null,
      flags: [],
      failover_in_progress: false,
      replicas: null,
      sentinels: null,
      sentinel: null,
      error: describeError(error),
    };
  }
}

/**
 * The whole report. `nodes` are the Redis nodes whose keys are scanned for
 * heartbeats (the one client on a standalone Redis, every master on a
 * cluster); `redis` answers single-key reads such as the layout.
 */
export async function readStatus(
  nodes: readonly Redis[],
  redis: RedisClient,
  config: Pick<TallyConfig, 'prefix' | 'amqpNodes' | 'queue' | 'deadLetterQueue'> & Partial<Pick<TallyConfig, 'partitions' | 'source' | 'redisUrl'>>,
): Promise<StatusReport> {
  const depths: QueueDepth[] = [];
  const redisUrl = config.redisUrl;
  const [daemons, layout, queue, sentinel] = await Promise.all([
    listDaemons(nodes, config.prefix),
    readLayout(redis, config.prefix),
    readQueueStatus(config, depths),
    redisUrl !== undefined && isSentinelUrl(redisUrl) ? readSentinelStatus(redisUrl) : null,
  ]);
  const partitions = config.partitions ?? 1;
  if (config.source === 'stream') {
    const broker = await connectAnyNode(config.amqpNodes, 'tally-cli-status').catch(() => null);
    broker?.model.on('error', () => {});
    try {
      const streams = await readStreamStatus(redis, broker?.model ?? null, { prefix: config.prefix, queue: config.queue, partitions }, daemons);
      return { prefix: config.prefix, sentinel, layout, queue, daemons, partitions: [], streams };
    } finally {
      await broker?.model.close().catch(() => {});
    }
  }
  return { prefix: config.prefix, sentinel, layout, queue, daemons, partitions: partitionStatus(config.queue, partitions, depths, daemons), streams: [] };
}

function table(rows: string[][]): string[] {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  return rows.map((r) =>
    r
      .map((cell, c) => (c === r.length - 1 ? cell : cell.padEnd(widths[c]!)))
      .join('  ')
      .trimEnd(),
  );
}

export function statusText(report: StatusReport): string {
  const lines: string[] = [];
  const { layout, queue } = report;
  lines.push(
    `prefix  ${report.prefix}  ${layout === null ? '(no layout: no daemon has started on it)' : `${layout.virtual_shards} virtual shards, ${layout.mode} mode${layout.partitions > 1 ? `, ${layout.partitions} partitions` : ''}${layout.marker_scope === null ? '' : `, ${layout.marker_scope}-scoped markers`}${layout.marker_format !== null && fencedAdoptionOf(layout.marker_format) ? ' (fenced adoption)' : ''}`}`,
  );
  if (report.sentinel !== null) lines.push(sentinelLine(report.sentinel));
  if (queue.error !== undefined) lines.push(`queue   ${queue.name}: ${queue.error}`);
  else if (!queue.exists) lines.push(`queue   ${queue.name}: does not exist`);
  else {
    const dead = queue.dead_depth === null ? `${queue.dead_letter_queue} does not exist` : `${queue.dead_letter_queue}: ${queue.dead_depth} ready`;
    lines.push(`queue   ${queue.name}: ${queue.depth} ready, ${queue.consumers} consumer${queue.consumers === 1 ? '' : 's'}; ${dead}`);
  }
  lines.push(`daemons ${report.daemons.length} live`);
  if (report.daemons.length > 0) {
    const rows = [['HOST', 'PID', 'MODE', 'VERSION', 'CONSUMING', 'AMQP_NODE', 'OLDEST_UNACKED_S', 'IN_FLIGHT', 'LAST_BEAT_S_AGO', 'STARTED_AT']];
    for (const d of report.daemons) {
      rows.push([
        d.host,
        String(d.pid),
        d.source === 'stream' ? 'stream' : d.mode,
        d.version,
        d.consuming ? 'yes' : 'no',
        d.amqp_node ?? '-',
        d.oldest_unacked_s === null ? '-' : String(d.oldest_unacked_s),
        String(d.in_flight),
        String(d.last_beat_age_s),
        d.started_at,
      ]);
    }
    lines.push(...table(rows).map((line) => `  ${line}`));
  }
  if (report.partitions.length > 0) {
    const hostPid = new Map(report.daemons.map((d) => [d.id, `${d.host}:${d.pid}`]));
    const unheld = report.partitions.filter((p) => p.held_by.length === 0).length;
    lines.push(`partitions ${report.partitions.length}${unheld > 0 ? `, ${unheld} held by no daemon` : ''}`);
    const rows = [['PARTITION', 'QUEUE', 'READY', 'CONSUMERS', 'HELD_BY']];
    for (const p of report.partitions) {
      rows.push([
        String(p.partition),
        p.queue,
        p.depth === null ? '-' : String(p.depth),
        p.consumers === null ? '-' : String(p.consumers),
        p.held_by.length === 0 ? '-' : p.held_by.map((id) => hostPid.get(id) ?? id).join(', '),
      ]);
    }
    lines.push(...table(rows).map((line) => `  ${line}`));
  }
  if (report.streams.length > 0) {
    const hostPid = new Map(report.daemons.map((d) => [d.id, `${d.host}:${d.pid}`]));
    lines.push(`streams ${report.streams.length}`);
    const rows = [['PARTITION', 'STREAM', 'FIRST', 'LAST', 'COMMITTED', 'LAG', 'REWINDS', 'HELD_BY']];
    for (const p of report.streams) {
      const cell = (value: number | null) => (value === null ? '-' : String(value));
      rows.push([
        String(p.partition),
        p.stream,
        cell(p.first),
        cell(p.last),
        cell(p.committed),
        cell(p.lag),
        String(p.rewinds),
        p.held_by.length === 0 ? '-' : p.held_by.map((id) => hostPid.get(id) ?? id).join(', '),
      ]);
    }
    lines.push(...table(rows).map((line) => `  ${line}`));
  }
  return lines.join('\n');
}

/** `redis   sentinel master M: primary H:P, 1 replica, 3 Sentinels[; failover in progress (o_down, …)]`. */
export function sentinelLine(sentinel: SentinelStatus): string {
  const head = `redis   sentinel master ${sentinel.master}`;
  if (sentinel.primary === null) return `${head}: ${sentinel.error ?? 'no Sentinel answers'}`;
  const plural = (n: number | null, word: string): string => `${n ?? '?'} ${word}${n === 1 ? '' : 's'}`;
  const down = failoverFlags(sentinel.flags);
  return (
    `${head}: primary ${sentinel.primary}, ${plural(sentinel.replicas, 'replica')}, ${plural(sentinel.sentinels, 'Sentinel')}` +
    (down.length > 0 ? `; failover in progress (${down.join(', ')})` : '')
  );
}

/** The CLI command: one connection to each server, one attempt, then out. */
export async function statusCommand(config: TallyConfig, json: boolean, out: (line: string) => void): Promise<void> {
  // Heartbeat keys have no hash tag: on a cluster they are spread over every master.
  const report = await withCliRedis(config.redisUrl, (redis) => readStatus(scanNodes(redis), redis, config));
  out(json ? JSON.stringify(report) : statusText(report));
}
