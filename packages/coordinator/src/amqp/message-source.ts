/**
 * The boundary between where deliveries come from and the pipeline that
 * counts them. The pipeline acks and dead-letters through it (pipeline/
 * ports.ts Acker, DeadLetterPublisher); the daemon starts, stops and reads it.
 * queue-source.ts is the source of a queue (TALLY_SOURCE=queue),
 * stream-source.ts of a stream (TALLY_SOURCE=stream); a test's fake stands in
 * for them in-process.
 */
import type { ConsumeMessage } from 'amqplib';
import type { ChannelLink } from '../pipeline/delivery.js';
import type { Acker, DeadLetterPublisher } from '../pipeline/ports.js';

/** The reason onLinkDown gives for a partition this daemon handed over: not a loss. */
export const PARTITION_RELEASED = 'partition released';

/** What a source calls as deliveries and channels come and go (the composition wires them to the pipeline). */
export interface SourceHandlers {
  onDelivery(link: ChannelLink, message: ConsumeMessage): void;
  onLinkUp(link: ChannelLink): void;
  onLinkDown(link: ChannelLink, reason: string): void;
  /** Deliveries of a channel not yet acked: a released partition's channel closes once this is 0 (or after a handoff time). */
  unackedOn?(link: ChannelLink): number;
}

/** The broker's side of the link, for status, /readyz detail and gauges. */
export interface AmqpBrokerState {
  /** RabbitMQ blocks the connection (memory or disk alarm): dead-letter publishes wait until it unblocks. */
  readonly blocked: boolean;
  readonly blockedReason: string | null;
  readonly blockedSince: string | null;
  /** Dead-letter copies the broker returned unroutable since start; each original stayed unacked and was retried. */
  readonly unroutableDeadLetters: number;
}

export interface MessageSource extends Acker, DeadLetterPublisher {
  /** Connects (retrying what a retry can fix) and starts consuming; rejects with one line naming the fix otherwise. */
  start(): Promise<void>;
  /** Stops new deliveries; what is in flight stays acknowledgeable. Waits at most `timeoutMs` for the broker. */
  stopConsuming(timeoutMs: number): Promise<void>;
  /** Closes everything, each step waiting at most `timeoutMs`. */
  close(timeoutMs: number): Promise<void>;
  /** Connected, and consuming every partition it owns. */
  readonly consuming: boolean;
  /** Whether close() was called: a channel closing after it is the stop, not a loss. */
  readonly closing: boolean;
  /** Whether a channel is live now (the connection gauge). */
  readonly connected: boolean;
  /** The node it is connected to, redacted; null while it is not. */
  readonly node: string | null;
  readonly brokerState: AmqpBrokerState;
  /** TALLY_PARTITIONS > 1: the partitions it consumes and is not handing over, ascending. */
  readonly partitionsHeld: number[];
  /** A stream source: partitions refused because their stream is not the one checkpointed, with why; absent for a queue. */
  readonly refusedPartitions?: ReadonlyArray<{ readonly partition: number; readonly reason: string }>;
  /** TALLY_PARTITIONS > 1: the partitions it owns now (fleet/partition-balancer.ts). */
  assign(partitions: readonly number[]): void;
  /** TALLY_PARTITIONS > 1: a watchdog over subscriptions idle over ready messages (partition-channels.ts says why). */
  checkIdlePartitions(idleMs: number): Promise<void>;
}
