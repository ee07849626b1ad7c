/** What every drain and latency run of one bench invocation shares. */
import type { Redis } from 'ioredis';
import type { BenchOptions } from './options.js';

export interface BenchContext {
  readonly amqpUrl: string;
  /** The Redis every contender writes to: the private server unless --redis-url said otherwise. */
  readonly redisUrl: string;
  /** True when the bench owns that Redis: it may flush it between runs and its counters are exact. */
  readonly redisPrivate: boolean;
  /** The bench's control client on it (verification, INFO, polling). */
  readonly redis: Redis;
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

export function queueName(ctx: BenchContext, contender: string, label: string): string {
  return `bench.${contender}.${ctx.runId}.${label}`;
}

export function prefixName(ctx: BenchContext, contender: string, label: string): string {
  return `bench:${ctx.runId}:${contender}:${label}:`;
}

/** The fields of every contender run that come from the bench's context rather than from the run. */
export function contextRunFields(ctx: BenchContext) {
  return {
    amqpUrl: ctx.amqpUrl,
    redisUrl: ctx.redisUrl,
    prefetch: ctx.prefetch,
    ackEvery: ctx.ackEvery,
    ackWaitMs: ctx.ackWaitMs,
    traceSinkUrl: ctx.traceSinkUrl,
  };
}

/** The context of one invocation: the run's own resources, the rest from the command line. */
export function benchContext(
  options: BenchOptions,
  run: Pick<BenchContext, 'redisUrl' | 'redisPrivate' | 'redis' | 'runId' | 'traceSinkUrl' | 'log'>,
): BenchContext {
  return {
    ...run,
    amqpUrl: options.amqpUrl,
    prefetch: options.prefetch,
    ackEvery: options.ackEvery,
    ackWaitMs: options.ackWaitMs,
    virtualShards: 16,
    tallyEnv: options.tallyEnv,
  };
}
