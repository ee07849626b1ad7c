/** What every drain and latency run of one bench invocation shares. */
import { Redis, type Cluster } from 'ioredis';
import type { BenchOptions } from './options.js';
import { standaloneNodes, type RedisNodes } from './redis-nodes.js';

/**
 * `Client` is the control client's type: a standalone Redis (the default:
 * latency runs and the TTL sweep need one), or a Cluster client for the
 * drains of `--scale-out --redis-figures`; the drain takes either
 * (AnyBenchContext).
 */
export interface BenchContext<Client extends Redis | Cluster = Redis> {
  readonly amqpUrl: string;
  /** The Redis every contender writes to: the private server unless --redis-url said otherwise. */
  readonly redisUrl: string;
  /** True when the bench owns that Redis: it may flush it between runs and its counters are exact. */
  readonly redisPrivate: boolean;
  /** The bench's control client on it (verification, polling). */
  readonly redis: Client;
  /** One client per server, for INFO (memory, CPU, commands are per server) and flushes: the standalone server, or a cluster's masters and replicas. */
  readonly nodes: RedisNodes;
  /** Names this invocation's queues (`bench.<contender>.<runId>…`) and key prefixes (`bench:<runId>:…`). */
  readonly runId: string;
  readonly prefetch: number;
  readonly ackEvery: number;
  readonly ackWaitMs: number;
  readonly virtualShards: number;
  /** --tally-env: extra TALLY_* variables for every daemon run. */
  readonly tallyEnv: Readonly<Record<string, string>>;
  /** Where the traced contender exports its spans (a loopback OTLP sink the bench runs). */
  readonly traceSinkUrl: string;
  log(line: string): void;
}

/** A context with either control client: what the drain and the helpers below take. */
export type AnyBenchContext = BenchContext<Redis | Cluster>;

export function queueName(ctx: AnyBenchContext, contender: string, label: string): string {
  return `bench.${contender}.${ctx.runId}.${label}`;
}

export function prefixName(ctx: AnyBenchContext, contender: string, label: string): string {
  return `bench:${ctx.runId}:${contender}:${label}:`;
}

/** The fields of every contender run that come from the bench's context rather than from the run. */
export function contextRunFields(ctx: AnyBenchContext) {
  return {
    amqpUrl: ctx.amqpUrl,
    redisUrl: ctx.redisUrl,
    prefetch: ctx.prefetch,
    ackEvery: ctx.ackEvery,
    ackWaitMs: ctx.ackWaitMs,
    traceSinkUrl: ctx.traceSinkUrl,
  };
}

/** The context of one invocation: the run's own resources, the rest from the command line. A Cluster client comes with its nodes. */
export function benchContext<Client extends Redis | Cluster = Redis>(
  options: BenchOptions,
  run: Pick<BenchContext<Client>, 'redisUrl' | 'redisPrivate' | 'redis' | 'runId' | 'traceSinkUrl' | 'log'> & { readonly nodes?: RedisNodes },
): BenchContext<Client> {
  const nodes = run.nodes ?? (run.redis instanceof Redis ? standaloneNodes(run.redis) : null);
  if (nodes === null) throw new Error('benchContext: a Cluster client needs its nodes (clusterNodes)');
  return {
    ...run,
    nodes,
    amqpUrl: options.amqpUrl,
    prefetch: options.prefetch,
    ackEvery: options.ackEvery,
    ackWaitMs: options.ackWaitMs,
    // The daemons' own count (--tally-env may set it): counts and steady fills are laid out by it.
    virtualShards: Number(options.tallyEnv.TALLY_VIRTUAL_SHARDS ?? 16),
    tallyEnv: options.tallyEnv,
  };
}
