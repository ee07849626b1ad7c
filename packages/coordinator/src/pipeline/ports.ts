/**
 * What the delivery pipeline needs from the world, each as narrow as the
 * pipeline uses it. The daemon passes the real edges (the message source, WorkerPools,
 * StatsRecorder, ExposureMeter, DaemonMetrics); the unit tests pass fakes,
 * so every delivery rule runs in-process without a thread or a server.
 */
import type { ConsumeMessage } from 'amqplib';
import type { BatchResult, CounterName, WireBatchTask } from '@tally/shared';
import type { ChannelLink } from './delivery.js';
import type { ExposedPart } from '../telemetry/exposure-meter.js';

/** Runs one shard batch on the thread that owns the shard (worker-pools.ts). */
export interface BatchRunner {
  /** Resolves with the batch's result; a failure rejects, classified as failure-class.ts says. */
  run(task: WireBatchTask): Promise<BatchResult>;
  /** True once the threads are being stopped: a batch still retrying is given up and its deliveries stay unacked. */
  readonly stopped: boolean;
}

/** Acks on a channel (the message source: amqp/message-source.ts). */
export interface Acker {
  /** Acks `upTo`; with `multiple`, every outstanding tag up to it. */
  ack(channel: ChannelLink, upTo: number, multiple: boolean): void;
}

/** Publishes a copy to the dead-letter queue (amqp/dead-letter-publishing.ts). */
export interface DeadLetterPublisher {
  /** Resolves once the broker confirmed the copy, with its reason in `x-tally-reason` and `headers` added. */
  deadLetter(channel: ChannelLink, message: ConsumeMessage, reason: string, headers?: Record<string, unknown>): Promise<void>;
}

/** The counters of invariant 9 (stats-recorder.ts). */
export interface Counters {
  add(name: CounterName, amount?: number): void;
}

export interface Clock {
  /** Monotonic milliseconds: ages, stalls, durations. */
  now(): number;
  /** Epoch milliseconds: message ages against their timestamp property, dates in logs. */
  epochMs(): number;
}

export const SYSTEM_CLOCK: Clock = Object.freeze({ now: () => performance.now(), epochMs: () => Date.now() });

/** What a crash would cost right now (exposure-meter.ts): the pipeline tells it what moved. */
export interface Exposure {
  /** A channel came up: its deliveries are counted from now on. */
  channelChanged(link: unknown): void;
  /** A channel is gone: its unacked deliveries go back to the broker. */
  channelClosed(link: unknown): void;
  batchReturned(vshard: number): void;
  batchDone(parts: readonly ExposedPart[]): void;
  occupied(link: unknown, tag: number, share: number): void;
  acked(link: unknown, upTo: number): void;
  ackedOne(link: unknown, tag: number): void;
}

/**
 * Stream source: the watermarks this daemon has seen, per partition and
 * virtual shard (stream/stream-state.ts). A batch carries the ones it
 * expects; its result moves them on, or reports that one went backwards.
 */
export interface StreamLog {
  /** The watermark last seen for (partition, shard); -1 when none. */
  expected(partition: number, vshard: number): number;
  /** A batch left the watermark of (partition, shard) here. */
  applied(partition: number, vshard: number, watermark: number): void;
  /** A batch found the watermark of (partition, shard) below what was expected: Redis lost writes; replay the partition from `found` + 1. */
  rolledBack(partition: number, vshard: number, found: number, expected: number): void;
}

/** The batch and delivery histograms (telemetry/metrics.ts); absent without TALLY_METRICS_PORT. */
export interface PipelineMetrics {
  recordBatch(parts: number, elapsedMs: number, result: BatchResult): void;
  recordAck(receivedAt: number, publishedAt: number | undefined, wallNow: number, monotonicNow: number): void;
}
