/**
 * Pure: the bench's command line into a typed, validated, frozen options
 * object (the only place flags are read). Errors name the flag and the
 * accepted range, like the daemon's configuration errors.
 */
import { parseArgs } from 'node:util';
import { unknownSettingError } from '@tally/shared';
import { CONTENDERS, type ContenderName, type SweepName } from './results.js';

export type BenchCommand = 'run' | 'profile' | 'summarize-profiles' | 'scale-out' | 'shape-cost' | 'partitions' | 'natural-check' | 'help';

export interface BenchOptions {
  readonly command: BenchCommand;
  readonly quick: boolean;
  readonly rounds: number;
  readonly messages: number;
  readonly skus: number;
  readonly zipf: number;
  readonly minChanges: number;
  readonly maxChanges: number;
  readonly duplicateRate: number;
  readonly seed: number;
  readonly prefetch: number;
  readonly ackEvery: number;
  readonly ackWaitMs: number;
  /** Seconds of publishing per latency run. */
  readonly latencySeconds: number;
  /** Load sweep: fractions of the ceiling's drain rate (the 0.5 run happens in every round anyway). */
  readonly loads: readonly number[];
  readonly sweeps: readonly SweepName[];
  readonly sweepMessages: number;
  readonly batchSizes: readonly number[];
  readonly workerCounts: readonly number[];
  readonly changeRanges: ReadonlyArray<readonly [number, number]>;
  /** Marker TTL sweep: TTLs in seconds (none: skipped) and the publish rate. */
  readonly markerTtls: readonly number[];
  readonly markerTtlRate: number;
  readonly contenders: readonly ContenderName[];
  /** null: bench/results (quick: bench/results/quick), resolved by the entry against the bench package. */
  readonly outDir: string | null;
  readonly amqpUrl: string;
  /** null: start a private redis-server (the default). */
  readonly redisUrl: string | null;
  /** null: bench/results/profile. */
  readonly profileDir: string | null;
  /** Extra TALLY_* variables for every daemon run (--tally-env K=V, repeatable), e.g. to try a setting. */
  readonly tallyEnv: Readonly<Record<string, string>>;
  /**
   * --scale-out only: also drain the workload with the ceiling, the batched
   * reference, Tally two-step and atomic and the stream contenders on both
   * topologies, measuring Redis memory and CPU per message (a cluster's masters
   * summed, its replicas apart). On in the full run; in a quick run only with
   * --redis-figures (it adds twelve drains per round).
   */
  readonly redisFigures: boolean;
  /** --scale-out only: replicas per master of the bench's cluster (--cluster-replicas, 1 by default; 0 shows what replication costs the masters). */
  readonly clusterReplicas: number;
  /** Messages every contender drains first, outside the measured window (JIT, connections); 0: none. */
  readonly warmupMessages: number;
  /**
   * --steady-state: after each round's drains, each Tally mode drains again
   * on a prefix filled with the marker population the marker TTL holds at
   * `steadyRate` msg/s (no latency runs or sweeps unless asked for); with
   * --scale-out, in the Redis figures, on both topologies.
   */
  readonly steadyState: boolean;
  readonly steadyRate: number;
  /**
   * --steady-phase: how full the filled bucket of now is (0 ≤ F < 1), for
   * every Tally contender alike, instead of the elapsed fraction of the
   * clock's bucket at its fill. The bucket of now holds the hashes every
   * claim writes into, and a fuller one costs Redis more per marker: with
   * the clock, contenders filled minutes apart in one run meet different
   * ones. null: the clock (natural).
   */
  readonly steadyPhase: number | null;
  /** --natural-check: the sustained rate, the marker TTL and the measured window of both runs (natural-check-run.ts). */
  readonly naturalRate: number;
  readonly naturalTtlS: number;
  readonly naturalWindowS: number;
}

/** The workload flags of the command line, as the workload generator takes them. */
export function workloadShape(options: BenchOptions) {
  return {
    messages: options.messages,
    skus: options.skus,
    zipf: options.zipf,
    minChanges: options.minChanges,
    maxChanges: options.maxChanges,
    duplicateRate: options.duplicateRate,
    seed: options.seed,
  };
}

/** The contenders of a steady-state run unless --contenders says otherwise: the references the ratios need, and both modes. */
export const STEADY_CONTENDERS: readonly ContenderName[] = ['ceiling', 'batched', 'tally-two-step', 'tally-atomic', 'ceiling-stream', 'tally-stream'];

export class BenchUsageError extends Error {
  readonly code = 'BENCH_USAGE';
}

/** --tally-env pairs: each a Tally setting, refused here (not after a bench's setup) when the daemon would refuse it. */
function tallyEnv(pairs: readonly string[]): Readonly<Record<string, string>> {
  const env = Object.fromEntries(
    pairs.map((pair) => {
      const match = pair.match(/^(TALLY_[A-Z0-9_]+)=(.*)$/);
      if (!match) throw new BenchUsageError(`--tally-env must be TALLY_NAME=value, got ${JSON.stringify(pair)}`);
      return [match[1]!, match[2]!];
    }),
  );
  const unknown = unknownSettingError(env);
  if (unknown !== null) throw new BenchUsageError(`--tally-env: ${unknown.message}`);
  return Object.freeze(env);
}

const FULL = {
  warmupMessages: 5_000,
  markerTtls: [4, 8, 16, 32],
  rounds: 3,
  messages: 50_000,
  latencySeconds: 4,
  loads: [0.1, 0.25, 0.5, 0.75],
  sweeps: ['batch-size', 'workers', 'changes'] as SweepName[],
  sweepMessages: 30_000,
};

const QUICK = {
  warmupMessages: 1_000,
  markerTtls: [] as number[],
  rounds: 1,
  messages: 4_000,
  latencySeconds: 1,
  loads: [] as number[],
  sweeps: [] as SweepName[],
  sweepMessages: 4_000,
};

export const USAGE = `usage: pnpm bench [--quick] [flags]
       pnpm bench --steady-state [--steady-rate N]  fresh drains, then each Tally mode again on a prefix filled with the
                                                    marker population the marker TTL holds at N msg/s (20000); writes
                                                    steady-state.md/.json (no latency runs or sweeps unless asked for)
                  [--steady-phase F]                fill the bucket of now to F (0..0.99) for every contender alike,
                                                    not to the clock's elapsed fraction: like-for-like Redis CPU
       pnpm bench --profile [--profile-dir DIR]      drain once with Tally under --cpu-prof and summarize
       pnpm bench --summarize-profiles DIR          summarize existing .cpuprofile files
       pnpm bench --natural-check                   the steady-state fill against a natural steady state: two-step at
                  [--natural-rate N] [--natural-ttl S] N msg/s (3000) from an empty prefix for two marker TTLs of S s (600),
                  [--natural-window S]              then on a filled one; a window of S s (100) each, side by side
       pnpm bench --shape-cost [--quick]            a mapped message shape (TALLY_MESSAGE_MAPPING) against the contract's:
                                                    parse + split in process, then daemon CPU per message, drain pairs
       pnpm bench --partitions [--quick]            TALLY_PARTITIONS = 1, 2, 4 with 1 to 3 daemons (quick: 1, 4 and 1, 2),
                                                    Tally atomic, preloaded drain, per-run msg/s and daemon CPU per message
       pnpm bench --scale-out [--quick]             Tally atomic on a standalone Redis vs a 3-master cluster,
                                                    1, 2, 3 daemons (quick: 1, 2) on one queue, pair by pair
                  [--redis-figures]                 then ceiling, batched, Tally drains on both: Redis B and CPU µs
                                                    per message, masters summed, replicas apart (full run: always)
                  [--cluster-replicas N]            replicas per master (1; 0 to see what replication costs)
                  [--steady-state [--steady-rate N]] batched and the Tally modes drain again on filled prefixes,
                                                    both topologies (implies --redis-figures)

workload:  --warmup N (5000; quick 1000): drained first by every contender, outside the measured window; 0: none
           --messages N (50000; quick 4000)  --skus N (10000)  --zipf S (1)  --changes MIN-MAX (1-8)
           --duplicate-rate R (0.02)  --seed N (1)
rounds:    --rounds N (3; quick 1)  --contenders a,b (ceiling,naive,batched,tally-two-step,tally-native-claims,tally-atomic,tally-traced)
latency:   --latency-seconds S (4; quick 1)  --loads F,F (0.1,0.25,0.5,0.75; quick none)
sweeps:    --sweeps batch-size,workers,changes|none (all; quick none)  --sweep-messages N (30000)
           --batch-sizes 50,200,500,2000  --workers 1,2,4  --change-ranges 1-2,1-8,8-16
           --marker-ttls 4,8,16,32|none (quick none)  --marker-ttl-rate N (2000): steady-state marker memory per TTL
consumers: --prefetch N (2000)  --ack-every N (500)  --ack-wait-ms N (50)
servers:   --amqp-url URL (TALLY_AMQP_URL or local)  --redis-url URL (default: a private redis-server)
daemon:    --tally-env TALLY_NAME=value (repeatable; applied to every Tally run, sweeps override their own variable)
output:    --out DIR (bench/results; quick: bench/results/quick)`;

function int(flag: string, raw: string | undefined, fallback: number, min: number, max: number): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max)
    throw new BenchUsageError(`--${flag} must be an integer in ${min}..${max}, got ${JSON.stringify(raw)}`);
  return value;
}

function num(flag: string, raw: string | undefined, fallback: number, min: number, max: number): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(value) || value < min || value > max)
    throw new BenchUsageError(`--${flag} must be a number in ${min}..${max}, got ${JSON.stringify(raw)}`);
  return value;
}

export function range(flag: string, raw: string): [number, number] {
  const match = raw.match(/^(\d+)-(\d+)$/);
  const lo = match ? Number(match[1]) : Number.NaN;
  const hi = match ? Number(match[2]) : Number.NaN;
  if (!match || lo < 1 || hi < lo || hi > 10_000)
    throw new BenchUsageError(`--${flag} must be MIN-MAX with 1 <= MIN <= MAX <= 10000, got ${JSON.stringify(raw)}`);
  return [lo, hi];
}

function list<T>(flag: string, raw: string | undefined, fallback: readonly T[], each: (item: string) => T): readonly T[] {
  if (raw === undefined) return fallback;
  if (raw === 'none' || raw === '') return [];
  return raw.split(',').map((item) => each(item.trim()));
}

export function parseBenchArgs(argv: readonly string[], env: Readonly<Record<string, string | undefined>> = {}): BenchOptions {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...argv],
      strict: true,
      allowPositionals: false,
      options: {
        quick: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
        profile: { type: 'boolean' },
        'scale-out': { type: 'boolean' },
        partitions: { type: 'boolean' },
        'shape-cost': { type: 'boolean' },
        'steady-state': { type: 'boolean' },
        'steady-rate': { type: 'string' },
        'steady-phase': { type: 'string' },
        'natural-check': { type: 'boolean' },
        'natural-rate': { type: 'string' },
        'natural-ttl': { type: 'string' },
        'natural-window': { type: 'string' },
        warmup: { type: 'string' },
        'redis-figures': { type: 'boolean' },
        'cluster-replicas': { type: 'string' },
        'profile-dir': { type: 'string' },
        'summarize-profiles': { type: 'string' },
        rounds: { type: 'string' },
        messages: { type: 'string' },
        skus: { type: 'string' },
        zipf: { type: 'string' },
        changes: { type: 'string' },
        'duplicate-rate': { type: 'string' },
        seed: { type: 'string' },
        prefetch: { type: 'string' },
        'ack-every': { type: 'string' },
        'ack-wait-ms': { type: 'string' },
        'latency-seconds': { type: 'string' },
        loads: { type: 'string' },
        sweeps: { type: 'string' },
        'sweep-messages': { type: 'string' },
        'batch-sizes': { type: 'string' },
        workers: { type: 'string' },
        'change-ranges': { type: 'string' },
        'marker-ttls': { type: 'string' },
        'marker-ttl-rate': { type: 'string' },
        contenders: { type: 'string' },
        out: { type: 'string' },
        'amqp-url': { type: 'string' },
        'redis-url': { type: 'string' },
        'tally-env': { type: 'string', multiple: true },
      },
    });
  } catch (error) {
    throw new BenchUsageError(error instanceof Error ? error.message : String(error));
  }
  const v = parsed.values;
  const quick = v.quick === true;
  const steadyState = v['steady-state'] === true;
  // A steady-state run is about the drains: no latency runs, sweeps or TTL sweep unless asked for.
  const base = steadyState ? { ...(quick ? QUICK : FULL), loads: [], sweeps: [], markerTtls: [] } : quick ? QUICK : FULL;
  const [minChanges, maxChanges] = v.changes === undefined ? [1, 8] : range('changes', v.changes);
  const command: BenchCommand = v.help
    ? 'help'
    : v['summarize-profiles'] !== undefined
      ? 'summarize-profiles'
      : v.profile
        ? 'profile'
        : v['scale-out']
          ? 'scale-out'
          : v['shape-cost']
            ? 'shape-cost'
            : v.partitions
              ? 'partitions'
              : v['natural-check']
                ? 'natural-check'
                : 'run';
  for (const flag of ['redis-figures', 'cluster-replicas'] as const)
    if (v[flag] !== undefined && command !== 'scale-out') throw new BenchUsageError(`--${flag} goes with --scale-out`);
  if (steadyState && command !== 'run' && command !== 'scale-out')
    throw new BenchUsageError('--steady-state goes with a plain run or --scale-out (not --profile, --shape-cost, --partitions or --summarize-profiles)');
  for (const flag of ['steady-rate', 'steady-phase'] as const)
    if (v[flag] !== undefined && !steadyState) throw new BenchUsageError(`--${flag} goes with --steady-state`);
  for (const flag of ['natural-rate', 'natural-ttl', 'natural-window'] as const)
    if (v[flag] !== undefined && command !== 'natural-check') throw new BenchUsageError(`--${flag} goes with --natural-check`);
  const contenders = list('contenders', v.contenders, steadyState ? STEADY_CONTENDERS : CONTENDERS, (c) => {
    if (!(CONTENDERS as readonly string[]).includes(c)) throw new BenchUsageError(`--contenders accepts ${CONTENDERS.join(', ')}; got ${JSON.stringify(c)}`);
    return c as ContenderName;
  });
  const sweeps = list('sweeps', v.sweeps, base.sweeps, (s) => {
    if (s !== 'batch-size' && s !== 'workers' && s !== 'changes')
      throw new BenchUsageError(`--sweeps accepts batch-size, workers, changes or none; got ${JSON.stringify(s)}`);
    return s as SweepName;
  });
  return Object.freeze({
    command,
    quick,
    rounds: int('rounds', v.rounds, base.rounds, 1, 50),
    messages: int('messages', v.messages, base.messages, 100, 5_000_000),
    skus: int('skus', v.skus, 10_000, 1, 10_000_000),
    zipf: num('zipf', v.zipf, 1, 0, 5),
    minChanges,
    maxChanges,
    duplicateRate: num('duplicate-rate', v['duplicate-rate'], 0.02, 0, 1),
    seed: int('seed', v.seed, 1, 0, 2 ** 31),
    prefetch: int('prefetch', v.prefetch, 2_000, 1, 65_535),
    ackEvery: int('ack-every', v['ack-every'], 500, 1, 65_535),
    ackWaitMs: int('ack-wait-ms', v['ack-wait-ms'], 50, 0, 60_000),
    latencySeconds: num('latency-seconds', v['latency-seconds'], base.latencySeconds, 0.5, 600),
    loads: list('loads', v.loads, base.loads, (f) => num('loads', f, 0, 0.01, 2)),
    sweeps,
    sweepMessages: int('sweep-messages', v['sweep-messages'], base.sweepMessages, 100, 5_000_000),
    batchSizes: list('batch-sizes', v['batch-sizes'], [50, 200, 500, 2_000], (b) => int('batch-sizes', b, 0, 1, 100_000)),
    workerCounts: list('workers', v.workers, [1, 2, 4], (w) => int('workers', w, 0, 1, 64)),
    changeRanges: list(
      'change-ranges',
      v['change-ranges'],
      [
        [1, 2],
        [1, 8],
        [8, 16],
      ] as Array<[number, number]>,
      (r) => range('change-ranges', r),
    ),
    markerTtls: list('marker-ttls', v['marker-ttls'], base.markerTtls, (t) => int('marker-ttls', t, 0, 1, 3_600)),
    markerTtlRate: int('marker-ttl-rate', v['marker-ttl-rate'], 2_000, 10, 100_000),
    contenders,
    // The steady drains of --scale-out are Redis figures: --steady-state brings them in a quick run too.
    redisFigures: command === 'scale-out' && (v['redis-figures'] === true || !quick || steadyState),
    clusterReplicas: int('cluster-replicas', v['cluster-replicas'], 1, 0, 2),
    warmupMessages: int('warmup', v.warmup, base.warmupMessages, 0, 1_000_000),
    steadyState,
    steadyRate: int('steady-rate', v['steady-rate'], 20_000, 1, 1_000_000),
    steadyPhase: v['steady-phase'] === undefined ? null : num('steady-phase', v['steady-phase'], 0, 0, 0.99),
    naturalRate: int('natural-rate', v['natural-rate'], 3_000, 10, 100_000),
    naturalTtlS: int('natural-ttl', v['natural-ttl'], 600, 4, 3_600),
    naturalWindowS: int('natural-window', v['natural-window'], 100, 2, 3_600),
    outDir: v.out ?? null,
    amqpUrl: v['amqp-url'] ?? env.TALLY_AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672',
    redisUrl: v['redis-url'] ?? null,
    profileDir: v['summarize-profiles'] ?? v['profile-dir'] ?? null,
    tallyEnv: tallyEnv(v['tally-env'] ?? []),
  });
}
