/**
 * Pure: the Redis figures of `pnpm bench --scale-out` (redis-figures-run.ts),
 * one row per topology and contender, medians over rounds and ratios pair by
 * pair within a round as in the main table (results.ts), and their table.
 */
import { cell, markdownTable } from './render-table.js';
import { readsStream, summarize, type ContenderName, type ContenderSummary, type DrainRecord, type MarkerMemoryRecord } from './results.js';
import { median } from './stats.js';

export type TopologyName = 'standalone' | 'cluster';

/**
 * The ceilings give the × ceiling ratio of the same round and topology (a
 * stream's own for the stream); the hand-written batched consumer the ×
 * batched ratios (on a cluster, its cluster-aware form: consumers/batched.ts);
 * the two Tally modes and Tally on a stream are what is measured.
 */
export const FIGURE_CONTENDERS: readonly ContenderName[] = Object.freeze([
  'ceiling',
  'batched',
  'tally-two-step',
  'tally-atomic',
  'ceiling-stream',
  'tally-stream',
]);

export interface TopologyDrain {
  readonly topology: TopologyName;
  readonly record: DrainRecord;
  readonly marker?: MarkerMemoryRecord;
}

/** CPU the servers of a topology use with no client at all (cron, and on a cluster the bus's gossip), over `seconds`. */
export interface IdleCpu {
  readonly topology: TopologyName;
  readonly seconds: number;
  readonly mastersCpuSeconds: number;
  readonly replicasCpuSeconds: number | null;
}

export interface FiguresRow extends Pick<
  ContenderSummary,
  | 'contender'
  | 'label'
  | 'rounds'
  | 'msgPerSec'
  | 'ratioToCeiling'
  | 'ratioToBatched'
  | 'redisCpuToBatched'
  | 'redisCpuUsPerMessage'
  | 'redisBytesPerMessage'
  | 'redisCommandsPerMessage'
  | 'markerBytesPerMessage'
  | 'correct'
> {
  readonly topology: TopologyName;
  /** Daemon (consumer) CPU per message, µs. */
  readonly cpuUsPerMessage: number;
  /** The part of redisCpuUsPerMessage the servers would have used idle over the drain's duration. */
  readonly idleCpuUsPerMessage: number;
  /** Cluster only (else empty / NaN): each master's share of redisBytesPerMessage, the masters' replication backlogs' share, the replicas' copy. */
  readonly perMasterBytesPerMessage: readonly number[];
  readonly backlogBytesPerMessage: number;
  readonly replicaBytesPerMessage: number;
  readonly replicaCpuUsPerMessage: number;
  /** Where the bytes go (RedisDrainDetail): keys left per message, the keyspace hash tables' bytes and their slot-to-keys part. */
  readonly keysPerMessage: number;
  readonly hashtableBytesPerMessage: number;
  readonly slotToKeysBytesPerMessage: number;
  /** MOVED and ASK replies over the drains of the row (all rounds). */
  readonly redirects: number;
}

const sum = (values: Iterable<number>): number => [...values].reduce((a, b) => a + b, 0);

/** Median of one per-drain value over the topology's correct drains of one contender (rounds ≥ 0). */
function medianOf(drains: readonly DrainRecord[], value: (d: DrainRecord) => number | null): number {
  const values = drains.filter((d) => d.correct && d.round >= 0 && d.messages > 0).map(value);
  return median(values.filter((v): v is number => typeof v === 'number'));
}

export function idleCpuPerSecond(idle: readonly IdleCpu[], topology: TopologyName): number {
  const mine = idle.filter((i) => i.topology === topology && i.seconds > 0);
  return median(mine.map((i) => i.mastersCpuSeconds / i.seconds));
}

/** Deliveries whose writes a drain's memory figures hold: the warm-up's too (results.ts, redisBytesPerMessage). */
function written(d: DrainRecord): number {
  return d.memoryDeliveries ?? d.messages;
}

export function summarizeFigures(drains: readonly TopologyDrain[], idle: readonly IdleCpu[], rounds: number): FiguresRow[] {
  const rows: FiguresRow[] = [];
  for (const topology of ['standalone', 'cluster'] as const) {
    const mine = drains.filter((d) => d.topology === topology);
    if (mine.length === 0) continue;
    const records = mine.map((d) => d.record);
    const markers = mine.flatMap((d) => (d.marker ? [d.marker] : []));
    const idleRate = idleCpuPerSecond(idle, topology);
    // The stream's contenders and the hand-written reference only when they drained here (a run may leave them out).
    const ran = FIGURE_CONTENDERS.filter((c) => !(readsStream(c) || c === 'batched') || records.some((r) => r.contender === c));
    for (const s of summarize(ran, records, [], markers, rounds)) {
      // The row's own drains: a contender's fresh and steady rows each from their own variant.
      const own = records.filter((r) => r.contender === s.contender && (r.variant ?? 'fresh') === s.variant);
      const masters = Math.max(0, ...own.map((r) => r.cluster?.perMasterMemoryBytes.length ?? 0));
      rows.push({
        topology,
        contender: s.contender,
        label: s.label,
        rounds: s.rounds,
        msgPerSec: s.msgPerSec,
        ratioToCeiling: s.ratioToCeiling,
        ratioToBatched: s.ratioToBatched,
        redisCpuToBatched: s.redisCpuToBatched,
        cpuUsPerMessage: s.cpuSecondsPerMillion,
        redisCpuUsPerMessage: s.redisCpuUsPerMessage,
        idleCpuUsPerMessage: medianOf(own, (d) => (Number.isFinite(idleRate) ? (idleRate * d.seconds * 1e6) / d.messages : null)),
        redisBytesPerMessage: s.redisBytesPerMessage,
        perMasterBytesPerMessage: Array.from({ length: masters }, (_, i) =>
          medianOf(own, (d) => (d.cluster ? d.cluster.perMasterMemoryBytes[i]! / written(d) : null)),
        ),
        backlogBytesPerMessage: medianOf(own, (d) => (d.cluster ? d.cluster.replicationBacklogBytes / written(d) : null)),
        replicaBytesPerMessage: medianOf(own, (d) => (d.cluster ? d.cluster.replicaMemoryBytes / written(d) : null)),
        replicaCpuUsPerMessage: medianOf(own, (d) => (d.cluster ? (d.cluster.replicaCpuSeconds * 1e6) / d.messages : null)),
        redisCommandsPerMessage: s.redisCommandsPerMessage,
        markerBytesPerMessage: s.markerBytesPerMessage,
        keysPerMessage: medianOf(own, (d) => (d.redisDetail ? d.redisDetail.keys / written(d) : null)),
        hashtableBytesPerMessage: medianOf(own, (d) => (d.redisDetail ? d.redisDetail.hashtableBytes / written(d) : null)),
        slotToKeysBytesPerMessage: medianOf(own, (d) => (d.redisDetail ? d.redisDetail.slotToKeysBytes / written(d) : null)),
        redirects: sum(own.map((d) => (d.redisDetail?.errors.MOVED ?? 0) + (d.redisDetail?.errors.ASK ?? 0))),
        correct: s.correct,
      });
    }
  }
  return rows;
}

export function renderFiguresTable(rows: readonly FiguresRow[]): string {
  const header = [
    'topology',
    'contender',
    'msg/s',
    '× ceiling',
    'daemon CPU µs / msg',
    'Redis CPU µs / msg (masters)',
    'of which idle',
    'Redis B / msg (masters)',
    'per master',
    'of which repl. backlog',
    'replicas B / msg',
    'replicas CPU µs / msg',
    'Redis cmds / msg',
    'marker B / msg',
    'counted correctly',
  ];
  const body = rows.map((r) => [
    r.topology,
    r.label,
    cell(r.msgPerSec),
    cell(r.ratioToCeiling, 2),
    cell(r.cpuUsPerMessage, 1),
    cell(r.redisCpuUsPerMessage, 1),
    cell(r.idleCpuUsPerMessage, 1),
    cell(r.redisBytesPerMessage, 0),
    r.perMasterBytesPerMessage.length === 0 ? 'n/a' : r.perMasterBytesPerMessage.map((b) => cell(b, 0)).join(' / '),
    cell(r.backlogBytesPerMessage, 0),
    cell(r.replicaBytesPerMessage, 0),
    cell(r.replicaCpuUsPerMessage, 1),
    cell(r.redisCommandsPerMessage, 2),
    cell(r.markerBytesPerMessage, 0),
    r.correct ? 'yes' : 'NO',
  ]);
  return markdownTable(header, body);
}

/** Where the bytes of each row go, and whether any command was redirected to another node. */
export function renderBreakdownTable(rows: readonly FiguresRow[]): string {
  const header = ['topology', 'contender', 'keys / msg', 'keyspace tables B / msg', 'of which slot-to-keys', 'MOVED + ASK replies'];
  const body = rows
    .filter((r) => r.contender !== 'ceiling' && r.contender !== 'ceiling-stream')
    .map((r) => [
      r.topology,
      r.label,
      cell(r.keysPerMessage, 3),
      cell(r.hashtableBytesPerMessage, 1),
      cell(r.slotToKeysBytesPerMessage, 1),
      String(r.redirects),
    ]);
  return markdownTable(header, body);
}

/** One line per topology: the servers' CPU with nothing running, in ms per second (masters; replicas apart). */
export function renderIdleLine(idle: readonly IdleCpu[]): string {
  const parts = (['standalone', 'cluster'] as const).flatMap((topology) => {
    const mine = idle.filter((i) => i.topology === topology && i.seconds > 0);
    if (mine.length === 0) return [];
    const masters = median(mine.map((i) => (i.mastersCpuSeconds * 1e3) / i.seconds));
    const replicas = median(mine.flatMap((i) => (i.replicasCpuSeconds === null ? [] : [(i.replicasCpuSeconds * 1e3) / i.seconds])));
    return [`${topology} ${cell(masters, 1)} ms/s${Number.isFinite(replicas) ? ` (replicas ${cell(replicas, 1)} ms/s)` : ''}`];
  });
  return `Idle server CPU, no client connected but the bench's: ${parts.join('; ')}.`;
}

/**
 * What the issue's goals read: per row but the ceilings (fresh and steady),
 * Redis CPU per message on each topology and cluster ÷ standalone (the
 * medians of each topology's rounds: the pairs ran in one run, but not side
 * by side, so a loaded round moves one side only), and on each topology ×
 * the hand-written batched consumer's (pair by pair within a round, against
 * its steady-state drain when it ran one: summarize's redisCpuToBatched).
 */
export function renderClusterRatioTable(rows: readonly FiguresRow[]): string {
  const header = ['contender', 'standalone µs / msg', 'cluster µs / msg', 'cluster ÷ standalone', 'standalone × batched', 'cluster × batched'];
  const body: string[][] = [];
  for (const standalone of rows.filter((r) => r.topology === 'standalone' && r.contender !== 'ceiling' && r.contender !== 'ceiling-stream')) {
    const cluster = rows.find((r) => r.topology === 'cluster' && r.label === standalone.label);
    if (cluster === undefined) continue;
    body.push([
      standalone.label,
      cell(standalone.redisCpuUsPerMessage, 1),
      cell(cluster.redisCpuUsPerMessage, 1),
      cell(cluster.redisCpuUsPerMessage / standalone.redisCpuUsPerMessage, 2),
      cell(standalone.redisCpuToBatched, 2),
      cell(cluster.redisCpuToBatched, 2),
    ]);
  }
  return markdownTable(header, body);
}
