/**
 * The shape of bench/results/latest.json, and the pure step from raw
 * per-round records to one summary row per contender.
 */
import { median, medianRatio } from './stats.js';

export const CONTENDERS = [
  'ceiling',
  'naive',
  'batched',
  'tally-two-step',
  'tally-native-claims',
  'tally-atomic',
  'tally-traced',
  'ceiling-stream',
  'tally-stream',
] as const;
export type ContenderName = (typeof CONTENDERS)[number];

export const CONTENDER_LABELS: Readonly<Record<ContenderName, string>> = Object.freeze({
  ceiling: 'ceiling (bare amqplib)',
  naive: 'naive (per message)',
  batched: 'batched (hand-written, 500/batch)',
  'tally-two-step': 'Tally two-step',
  'tally-native-claims': 'Tally two-step, native claims',
  'tally-atomic': 'Tally atomic',
  'tally-traced': 'Tally two-step, traced (100%)',
  'ceiling-stream': 'ceiling, stream (bare amqplib)',
  'tally-stream': 'Tally, stream (TALLY_SOURCE=stream)',
});

/** The contenders that read a stream (preloaded into one), not a queue. */
export function readsStream(contender: ContenderName): boolean {
  return contender === 'ceiling-stream' || contender === 'tally-stream';
}

/** One drain of a preloaded queue by one contender in one round. */
export interface DrainRecord {
  readonly contender: ContenderName;
  readonly round: number;
  /** Deliveries drained (duplicates included). */
  readonly messages: number;
  readonly seconds: number;
  readonly msgPerSec: number;
  /** utime + stime of the consumer process (all its threads) over the drain. */
  readonly cpuSeconds: number;
  /** VmHWM of the consumer process. */
  readonly peakRssBytes: number;
  /** Commands the private Redis processed for this drain, the bench's own polling subtracted; null for the ceiling. */
  readonly redisCommands: number | null;
  /**
   * used_memory of the private Redis after the drain (contender stopped)
   * minus before it (right after the flush): what the run left behind,
   * markers, receipts and counts included. Null on a shared Redis.
   */
  readonly redisMemoryBytes: number | null;
  /** used_cpu_sys + used_cpu_user of the private Redis over the drain (INFO cpu); null on a shared Redis. */
  readonly redisCpuSeconds: number | null;
  /**
   * On a private Redis Cluster (`--scale-out --redis-figures`), where
   * redisMemoryBytes, redisCpuSeconds and redisCommands are sums over the
   * masters: each master's used_memory delta, the part of the sum the
   * masters' replication backlogs took, and the replicas' used_memory and
   * CPU deltas summed (a copy of the masters' data, not in the sums above).
   */
  readonly cluster?: ClusterDrainFigures;
  /** Private Redis only: what the Redis figures are made of (sums over a cluster's masters). */
  readonly redisDetail?: RedisDrainDetail;
  /** 'steady': the drain ran on a prefix filled with the steady-state marker population first (--steady-state). */
  readonly variant?: DrainVariant;
  /** utime + stime of the consumer's main thread alone (/proc/<pid>/task/<pid>/stat) over the drain. */
  readonly mainThreadCpuSeconds?: number;
  /** The warm-up the contender drained first, outside the measured window (absent: none). */
  readonly warmup?: WarmupFigures;
  /** Deliveries whose writes redisMemoryBytes holds: the warm-up's and the drain's (absent: `messages`). */
  readonly memoryDeliveries?: number;
  /** --steady-state: the population the prefix held before the drain. */
  readonly steady?: SteadyFillRecord;
  /** Reads of the daemon's /metrics the bench made to find the window's ends (Tally only). */
  readonly metricsReads?: number;
  /** Mean parts per shard batch the daemon sent in the window (tally_batch_size; Tally only; a part is a message with message-scoped markers). */
  readonly partsPerBatch?: number;
  readonly correct: boolean;
  readonly problem?: string;
}

export type DrainVariant = 'fresh' | 'steady';

export interface WarmupFigures {
  readonly deliveries: number;
  /** From the contender consuming to it having acked the warm-up. */
  readonly seconds: number;
  readonly msgPerSec: number;
}

/** The marker population a steady-state drain started on (marker-fill.ts), and what filling it took. */
export interface SteadyFillRecord {
  /** Messages per second the population is that of. */
  readonly rate: number;
  readonly markerTtlS: number;
  readonly bucketWidthS: number;
  readonly partsPerMessage: number;
  readonly liveBuckets: number;
  /** Elapsed fraction of the bucket of now when it was filled. */
  readonly currentFraction: number;
  readonly markers: number;
  /** Write receipts filled beside the markers (receipt-fill.ts); absent in runs from before they were, 0 for the batched reference. */
  readonly receipts?: number;
  readonly hashes: number;
  /** Sub-buckets of each shard's buckets (openBucket's rule), lowest and highest over the shards. */
  readonly subBuckets: readonly [number, number];
  readonly fillSeconds: number;
  /** used_memory the fill added. */
  readonly fillBytes: number;
  /** The daemon found the layout the fill wrote ("shard layout verified", created false). */
  readonly layoutFound: boolean;
}

export interface RedisDrainDetail {
  /** Keys left after the drain (markers, meta hashes, receipts, counts, layout, stats). */
  readonly keys: number;
  /** Part of redisMemoryBytes: the keyspace's own hash tables (MEMORY STATS overhead.hashtable.*), after minus before. */
  readonly hashtableBytes: number;
  /** Part of hashtableBytes: a cluster node's slot-to-keys links (Redis 7.0: two pointers per key); 0 on a standalone server. */
  readonly slotToKeysBytes: number;
  /** Calls per command over the CPU window (INFO commandstats: the bench's own INFO and MGETs included, and the commands scripts call). */
  readonly commandCalls: Readonly<Record<string, number>>;
  /**
   * Microseconds per command over the same window (INFO commandstats usec). A script's own commands count both in
   * them and in EVALSHA; what no command holds (reading and parsing requests, expiring keys) is the rest of the CPU.
   */
  readonly commandUsec?: Readonly<Record<string, number>>;
  /** Error replies by prefix from the flush before the drain to the stop after it (INFO errorstats): MOVED and ASK are redirects to another node. */
  readonly errors: Readonly<Record<string, number>>;
}

export interface ClusterDrainFigures {
  readonly perMasterMemoryBytes: readonly number[];
  readonly replicationBacklogBytes: number;
  readonly replicaMemoryBytes: number;
  readonly replicaCpuSeconds: number;
}

/** One run at a controlled publish rate, measuring end-to-end latency. */
export interface LatencyRecord {
  readonly contender: ContenderName;
  /** The round for the 50% runs; null for the load sweep. */
  readonly round: number | null;
  readonly loadFraction: number;
  readonly targetRate: number;
  readonly achievedRate: number;
  readonly published: number;
  readonly samples: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  /** `ack`: the consumer timed each ack itself; `marker-probe`: the bench polled Redis for the markers of sampled messages. */
  readonly method: 'ack' | 'marker-probe';
  readonly correct: boolean;
  readonly problem?: string;
}

export interface MarkerMemoryRecord {
  readonly contender: ContenderName;
  readonly round: number;
  readonly markers: number;
  /** Unique messages the markers belong to. */
  readonly messages: number;
  readonly bytesPerMarker: number;
  readonly bytesPerMessage: number;
}

/** One point of the marker TTL sweep (marker-ttl-sweep.ts): steady-state marker memory at one TTL. */
export interface MarkerTtlRecord {
  readonly ttlS: number;
  /** Publish rate, msg/s. */
  readonly rate: number;
  /** used_memory samples taken over the last TTL of the run. */
  readonly samples: number;
  /** Mean bytes the markers and receipts held over that TTL. */
  readonly markerBytes: number;
  /** markerBytes / (rate × TTL): what one message costs in steady state. */
  readonly bytesPerMessage: number;
  readonly problem?: string;
}

export type SweepName = 'batch-size' | 'workers' | 'changes';

export interface SweepRecord {
  readonly sweep: SweepName;
  readonly label: string;
  /** Position on the x axis (batch size, threads, mean changes per message). */
  readonly x: number;
  readonly contender: ContenderName;
  readonly msgPerSec: number;
  /** The ceiling's rate on the same workload, measured right before. */
  readonly ceilingMsgPerSec: number;
  readonly ratioToCeiling: number;
  readonly correct: boolean;
}

export interface ContenderSummary {
  readonly contender: ContenderName;
  readonly variant: DrainVariant;
  readonly label: string;
  readonly rounds: number;
  readonly msgPerSec: number;
  readonly ratioToCeiling: number;
  readonly ratioToNaive: number;
  readonly ratioToBatched: number;
  /**
   * Redis CPU per message over the hand-written batched consumer's: at
   * steady state when both ran there (a stream has no marker population,
   * so its fresh drain is its steady one), else fresh.
   */
  readonly redisCpuToBatched: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly latencyMethod?: string;
  readonly cpuSecondsPerMillion: number;
  /** The main thread alone, µs per message (NaN where not measured). */
  readonly mainThreadCpuUsPerMessage: number;
  /** The warm-up drained before the measured window: its median duration and rate (NaN: none). */
  readonly warmupSeconds: number;
  readonly warmupMsgPerSec: number;
  /** Steady state: median markers the prefix held before the drain, and seconds the fill took (NaN: fresh). */
  readonly steadyMarkers: number;
  readonly fillSeconds: number;
  readonly peakRssMb: number;
  readonly redisCommandsPerMessage: number;
  /** Redis used_memory left by the drain, per message drained (duplicates included, as the issue measures). */
  readonly redisBytesPerMessage: number;
  /** Redis CPU (user + sys) per message drained, µs. */
  readonly redisCpuUsPerMessage: number;
  readonly markerBytesPerMarker: number;
  readonly markerBytesPerMessage: number;
  readonly correct: boolean;
}

/** Per-round values of one contender's field, indexed by round (null where it did not run or failed). */
function byRound(drains: readonly DrainRecord[], contender: ContenderName, rounds: number, field: (d: DrainRecord) => number | null): Array<number | null> {
  const values: Array<number | null> = new Array(rounds).fill(null);
  for (const d of drains) {
    if (d.contender === contender && d.correct && d.round < rounds) values[d.round] = field(d);
  }
  return values;
}

const finite = (values: ReadonlyArray<number | null>): number[] => values.filter((v): v is number => typeof v === 'number' && Number.isFinite(v));

export function summarize(
  contenders: readonly ContenderName[],
  drains: readonly DrainRecord[],
  latencies: readonly LatencyRecord[],
  memory: readonly MarkerMemoryRecord[],
  rounds: number,
): ContenderSummary[] {
  const fresh = drains.filter((d) => (d.variant ?? 'fresh') === 'fresh');
  const steady = drains.filter((d) => d.variant === 'steady');
  const rate = (c: ContenderName) => byRound(fresh, c, rounds, (d) => d.msgPerSec);
  const ceiling = rate('ceiling');
  // A stream contender is held against the bare consumer of the same stream.
  const streamCeiling = rate('ceiling-stream');
  const naive = rate('naive');
  const batched = rate('batched');
  const redisCpuPerMessage = (d: DrainRecord) => (d.redisCpuSeconds === null || d.messages === 0 ? null : (d.redisCpuSeconds * 1e6) / d.messages);
  const batchedSteady = byRound(steady, 'batched', rounds, redisCpuPerMessage);
  const batchedRedis = finite(batchedSteady).length > 0 ? batchedSteady : byRound(fresh, 'batched', rounds, redisCpuPerMessage);
  const row = (contender: ContenderName, variant: DrainVariant, mine: readonly DrainRecord[]): ContenderSummary => {
    const half = variant === 'fresh' ? latencies.filter((l) => l.contender === contender && l.round !== null && l.correct) : [];
    const marks = variant === 'fresh' ? memory.filter((m) => m.contender === contender) : [];
    const correct =
      mine.length > 0 && mine.every((d) => d.correct) && (variant === 'steady' || latencies.filter((l) => l.contender === contender).every((l) => l.correct));
    const per = (field: (d: DrainRecord) => number | null) => median(finite(byRound(mine, contender, rounds, field)));
    const mineRate = byRound(mine, contender, rounds, (d) => d.msgPerSec);
    return {
      contender,
      variant,
      label: variant === 'steady' ? `${CONTENDER_LABELS[contender]}, steady state` : CONTENDER_LABELS[contender],
      rounds: mine.length,
      msgPerSec: median(finite(mineRate)),
      ratioToCeiling: medianRatio(mineRate, readsStream(contender) ? streamCeiling : ceiling),
      ratioToNaive: medianRatio(mineRate, naive),
      ratioToBatched: medianRatio(mineRate, batched),
      redisCpuToBatched: medianRatio(byRound(mine, contender, rounds, redisCpuPerMessage), batchedRedis),
      p50Ms: median(half.map((l) => l.p50Ms)),
      p99Ms: median(half.map((l) => l.p99Ms)),
      ...(half.length > 0 ? { latencyMethod: half[0]!.method } : {}),
      cpuSecondsPerMillion: per((d) => (d.messages > 0 ? (d.cpuSeconds * 1e6) / d.messages : null)),
      mainThreadCpuUsPerMessage: per((d) => (d.mainThreadCpuSeconds === undefined || d.messages === 0 ? null : (d.mainThreadCpuSeconds * 1e6) / d.messages)),
      warmupSeconds: per((d) => d.warmup?.seconds ?? null),
      warmupMsgPerSec: per((d) => d.warmup?.msgPerSec ?? null),
      steadyMarkers: per((d) => d.steady?.markers ?? null),
      fillSeconds: per((d) => d.steady?.fillSeconds ?? null),
      peakRssMb: per((d) => d.peakRssBytes / (1024 * 1024)),
      redisCommandsPerMessage: per((d) => (d.redisCommands === null || d.messages === 0 ? null : d.redisCommands / d.messages)),
      // The memory holds the warm-up's writes too: per delivery written.
      redisBytesPerMessage: per((d) => {
        const deliveries = d.memoryDeliveries ?? d.messages;
        return d.redisMemoryBytes === null || deliveries === 0 ? null : d.redisMemoryBytes / deliveries;
      }),
      redisCpuUsPerMessage: per((d) => (d.redisCpuSeconds === null || d.messages === 0 ? null : (d.redisCpuSeconds * 1e6) / d.messages)),
      markerBytesPerMarker: median(marks.map((m) => m.bytesPerMarker)),
      markerBytesPerMessage: median(marks.map((m) => m.bytesPerMessage)),
      correct,
    };
  };
  const rows = contenders.map((contender) =>
    row(
      contender,
      'fresh',
      fresh.filter((d) => d.contender === contender),
    ),
  );
  for (const contender of contenders) {
    const mine = steady.filter((d) => d.contender === contender);
    if (mine.length > 0) rows.push(row(contender, 'steady', mine));
  }
  return rows;
}

export interface BenchResults {
  readonly version: 1;
  readonly startedAt: string;
  readonly finishedAt: string;
  readonly quick: boolean;
  /** --steady-state: the summary has a steady-state row per Tally mode (written to steady-state.json/.md). */
  readonly steadyState?: boolean;
  readonly machine: { readonly cpus: number; readonly node: string; readonly redis: string };
  readonly options: unknown;
  readonly rounds: number;
  readonly summary: readonly ContenderSummary[];
  readonly drains: readonly DrainRecord[];
  readonly latencies: readonly LatencyRecord[];
  readonly markerMemory: readonly MarkerMemoryRecord[];
  /** Absent in results written before the sweep existed. */
  readonly markerTtl?: readonly MarkerTtlRecord[];
  readonly sweeps: readonly SweepRecord[];
  readonly problems: readonly string[];
}
