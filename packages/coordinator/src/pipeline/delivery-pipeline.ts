/**
 * The path of a delivery, composed:
 *
 *   intake ──► shard lanes ──► shard batches ──► settlement ──► ack window
 *   (parse, dead-letter bad,   (one batch in     (run on the    (per delivery:   (exact multiple-acks,
 *    split, hold copies of      flight per        owner thread,  counted,         single acks behind a
 *    an id in flight)           shard)            retried)       duplicate, …)    stalled head)
 *
 * Everything it touches outside the process comes in through ports.ts: the
 * daemon passes the threads, the channel and the counters; the unit tests
 * (test/unit/delivery-pipeline.test.ts) pass fakes.
 */
import { trace, type Tracer } from '@opentelemetry/api';
import type { ConsumeMessage } from 'amqplib';
import type { BackoffOptions, TallyConfig } from '@tally/shared';
import type { BugHandler } from '../process/bug-exit.js';
import type { ChannelLink } from './delivery.js';
import type { Logger } from '../process/logger.js';
import { ShardLanes, type PendingPart } from './shard-lanes.js';
import { AckWindow, type ChannelFigures } from './ack-window.js';
import { DeadLetters } from './dead-letters.js';
import { InFlightMessages } from './in-flight.js';
import { Intake, type IntakeOptions } from './intake.js';
import {
  SYSTEM_CLOCK,
  type Acker,
  type BatchRunner,
  type Clock,
  type Counters,
  type DeadLetterPublisher,
  type Exposure,
  type PipelineMetrics,
  type StreamLog,
} from './ports.js';
import { batchObserver } from './batch-observer.js';
import { Settlement } from './settlement.js';
import { ShardBatches } from './shard-batches.js';

/** How long a part held by another daemon's claim waits before it is tried again. */
export const CLAIM_RETRY_MS = 200;

export type PipelineOptions = Pick<
  TallyConfig,
  'queue' | 'mode' | 'virtualShards' | 'acceptTypes' | 'maxMessageBytes' | 'prefetch' | 'stallMs' | 'batchSize' | 'batchMaxChanges' | 'batchWaitMs'
> &
  Partial<Pick<TallyConfig, 'source'>> &
  Pick<IntakeOptions, 'recordedMarkerScope' | 'injectBug' | 'messageMapping'> & {
    /** CLAIM_RETRY_MS by default. */
    readonly claimRetryMs?: number;
    /** The backoff of batch and dead-letter retries; the shared default when absent (tests shorten it). */
    readonly backoff?: BackoffOptions;
  };

export interface PipelineDeps {
  readonly runner: BatchRunner;
  readonly acker: Acker;
  readonly deadLetters: DeadLetterPublisher;
  readonly counters: Counters;
  readonly exposure: Exposure;
  readonly metrics?: PipelineMetrics | null;
  readonly clock?: Clock;
  readonly tracer?: Tracer;
  readonly log: Logger;
  /** Stream source (TALLY_SOURCE=stream): the watermarks seen (stream/stream-state.ts). Required then; absent for a queue. */
  readonly streamLog?: StreamLog;
  /**
   * Told of a bug met on the batch or delivery path (invariant 13,
   * bug-exit.ts): main.ts's handler logs it and exits 70. Acks stop first.
   * Without one the error is rethrown.
   */
  readonly onBug?: BugHandler;
}

export class DeliveryPipeline {
  private readonly acks: AckWindow;
  private readonly deadLetters: DeadLetters;
  private readonly inFlight: InFlightMessages;
  private readonly lanes: ShardLanes;
  private readonly intake: Intake;
  private readonly onBug: BugHandler | undefined;
  /** Checks for a stalled head (invariant 10) while deliveries come in. */
  private stallTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly options: PipelineOptions,
    deps: PipelineDeps,
  ) {
    const clock = deps.clock ?? SYSTEM_CLOCK;
    const tracer = deps.tracer ?? trace.getTracer('tally.coordinator');
    const metrics = deps.metrics ?? null;
    const stream = options.source === 'stream';
    const streamLog = deps.streamLog ?? null;
    if (stream && streamLog === null) throw new TypeError('a stream pipeline needs its stream log');
    this.inFlight = new InFlightMessages(!stream);
    this.acks = new AckWindow({ acker: deps.acker, exposure: deps.exposure, clock, log: deps.log }, options.stallMs);
    this.deadLetters = new DeadLetters(
      { publisher: deps.deadLetters, counters: deps.counters, acks: this.acks, tracer, log: deps.log },
      options.queue,
      options.backoff,
    );
    const observer = batchObserver({ counters: deps.counters, exposure: deps.exposure, metrics });
    const batches = new ShardBatches(options, { runner: deps.runner, observer, clock, tracer, log: deps.log, streamLog });
    const settlement = new Settlement({
      claimRetryMs: options.claimRetryMs ?? CLAIM_RETRY_MS,
      counters: deps.counters,
      exposure: deps.exposure,
      metrics,
      clock,
      acks: this.acks,
      deadLetters: this.deadLetters,
      inFlight: this.inFlight,
      hold: (vshard, part, delayMs) => this.lanes.hold(vshard, part, delayMs),
      streamLog,
    });
    // A batch retries every server failure itself: whatever escapes it is a bug (invariant 13).
    this.lanes = new ShardLanes(options, (vshard, pending) => {
      // Stream source: a part whose channel died waits for nothing; its offset is read again on the next channel.
      // Written anyway, a part left from before a rewind could carry a watermark past the range being replayed.
      const parts = stream ? liveParts(pending, settlement) : pending;
      if (parts.length === 0) return Promise.resolve();
      return batches
        .run(vshard, parts)
        .then((result) => {
          if (result !== null) settlement.batchDone(vshard, parts, result);
        })
        .catch((error: unknown) => this.bug(error, 'batch'));
    });
    this.onBug = deps.onBug;
    this.intake = new Intake(options, {
      acks: this.acks,
      counters: deps.counters,
      deadLetters: this.deadLetters,
      inFlight: this.inFlight,
      lanes: this.lanes,
      clock,
    });
  }

  /** A delivery from the broker. */
  accept(channel: ChannelLink, message: ConsumeMessage): void {
    // Thrown inside amqplib's frame loop, a bug would read as a broken connection and be retried as an outage.
    try {
      this.intake.accept(channel, message);
    } catch (error) {
      this.bug(error, 'delivery');
    }
  }

  /** A bug (invariant 13): nothing is acked from now on, and the handler (main.ts: log, exit 70) is told. */
  private bug(error: unknown, where: 'batch' | 'delivery'): void {
    this.acks.halt();
    if (this.onBug === undefined) throw error;
    this.onBug(error, where);
  }

  /** A new channel: its deliveries are acked on it; the old one's are left to redelivery. */
  channelUp(channel: ChannelLink): void {
    this.acks.channelUp(channel);
  }

  /** A channel is gone: how many of its deliveries were unacked, or null when it was not the live one. */
  channelDown(channel: ChannelLink): number | null {
    return this.acks.channelDown(channel);
  }

  /** Checks for a stalled head every so often: often enough to ack behind it within a second of TALLY_STALL_MS, cheap when nothing stalls. */
  startStallChecks(): void {
    if (this.stallTimer !== null) return;
    this.stallTimer = setInterval(() => this.sendAcks(), Math.min(1_000, Math.max(50, this.options.stallMs / 4)));
    this.stallTimer.unref();
  }

  stopStallChecks(): void {
    if (this.stallTimer !== null) clearInterval(this.stallTimer);
    this.stallTimer = null;
  }

  /** Sends what can be acked now: the multiple-ack at the head, and the single acks behind a stalled one. */
  sendAcks(): void {
    this.acks.send();
  }

  /** Every lane writes what it holds now, without waiting for its batch timer. */
  flushAll(): void {
    this.lanes.flushAll();
  }

  /** Nothing waits in a lane, no batch runs, no dead letter is unconfirmed, no delivery is unsettled. */
  get drained(): boolean {
    const load = this.lanes.load;
    return load.pendingParts === 0 && load.busyLanes === 0 && this.deadLetters.unsettled === 0 && this.inFlight.size === 0;
  }

  /**
   * Resolves once drained, or after `graceMs`; true when drained. Deliveries
   * that arrived before the cancel took effect add new parts meanwhile, hence
   * the loop; it ends early if nothing left could finish what is still
   * unsettled (its deliveries go back to the broker).
   */
  async drainWithin(graceMs: number): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, graceMs);
    });
    try {
      await Promise.race([this.whenDrained(), graceOver]);
    } finally {
      clearTimeout(timer);
    }
    return this.drained;
  }

  /** Clears the lanes' timers; parts still waiting or held are abandoned (their deliveries stay unacked). */
  close(): void {
    this.stopStallChecks();
    this.lanes.close();
  }

  /** Messages with parts not yet written (deliveries not yet acked are `unacked`: a written one waits for its ack). */
  get messagesInProgress(): number {
    return this.inFlight.size;
  }

  /** Deliveries of the live channels not yet acked. */
  get unacked(): number {
    return this.acks.unacked;
  }

  /** Deliveries of one channel not yet acked (a partition's handoff waits for 0). */
  unackedOn(channel: ChannelLink): number {
    return this.acks.unackedOn(channel);
  }

  /** Per live channel (per partition held): unacked and the oldest unacked age. */
  channels(): ChannelFigures[] {
    return this.acks.channels();
  }

  /** Age of the oldest unacked delivery; null when nothing is unacked. The one source of the gauge, the heartbeat's figure and /readyz's stall. */
  oldestUnackedAgeMs(): number | null {
    return this.acks.oldestUnackedAgeMs();
  }

  /** Parts waiting per lane, for the per-shard queue depth gauge. */
  laneDepths(): number[] {
    return this.lanes.depths();
  }

  get laneLoad(): { pendingParts: number; busyLanes: number } {
    return this.lanes.load;
  }

  private async whenDrained(): Promise<void> {
    while (!this.drained) {
      const load = this.lanes.load;
      if (load.pendingParts === 0 && load.busyLanes === 0 && this.deadLetters.unsettled === 0) return;
      await Promise.all([this.lanes.whenIdle(), this.deadLetters.whenSettled()]);
    }
  }
}

/** The parts whose channel is still live; the others' deliveries are abandoned (read again from the log). */
function liveParts(pending: PendingPart[], settlement: Settlement): PendingPart[] {
  let dead = 0;
  for (const part of pending) if (!part.delivery.link.alive) dead++;
  if (dead === 0) return pending;
  const live: PendingPart[] = [];
  for (const part of pending) {
    if (part.delivery.link.alive) live.push(part);
    else settlement.abandon(part.delivery);
  }
  return live;
}
