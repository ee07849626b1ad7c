/**
 * The source of a stream (TALLY_SOURCE=stream): RabbitMQ streams read by
 * offset, one partition per stream (`<queue>.<p>` behind the consistent-hash
 * exchange `<queue>`, or one stream `<queue>`), each on a confirm channel of
 * its own (partition-channels.ts), owned by one daemon at a time as the
 * heartbeats decide (streams refuse single active consumer: two daemons may
 * overlap during a handover, and the watermarks keep that exact).
 *
 * An ack on a stream only returns prefetch credit; what the log has been
 * counted up to is this daemon's to say. Every multiple-ack covers a
 * contiguous run of finished deliveries (ack-window.ts), so the offset of
 * its last one is a checkpoint: every message up to it is applied on every
 * shard, or skipped, or dead-lettered. The source commits that about once a
 * second (checkpoint-store.ts), and a daemon that takes the partition
 * resumes after it (resume-plan.ts).
 *
 * A batch that finds a watermark below what this daemon had seen means Redis
 * lost writes it had acknowledged (stream-state.ts): the partition is
 * rewound, its checkpoint moved back, and the lost range read again.
 */
import type { Channel, ChannelModel, ConsumeMessage, Message } from 'amqplib';
import { describeError, partitionQueue, redactUrl } from '@tally/shared';
import type { ChannelLink } from '../pipeline/delivery.js';
import type { Counters } from '../pipeline/ports.js';
import { within, TIMED_OUT } from '../process/deadline.js';
import type { Logger } from '../process/logger.js';
import type { CheckpointStore } from '../stream/checkpoint-store.js';
import { bodyHash, ResumeCursor, type StreamCursor } from '../stream/stream-cursor.js';
import { planResume, type StartAt, type StreamBounds } from '../stream/resume-plan.js';
import type { StreamState } from '../stream/stream-state.js';
import { BrokerConnection } from './broker-connection.js';
import { DeadLetterPublishing } from './dead-letter-publishing.js';
import type { AmqpBrokerState, MessageSource, SourceHandlers } from './message-source.js';
import { PartitionChannels, type SubscriptionStart } from './partition-channels.js';
import { declareTallyStreams } from './queue-declaration.js';
import { timestampToMs } from '../telemetry/metrics.js';
import type { StreamFigures } from '../telemetry/stream-gauges.js';

export interface StreamSourceOptions {
  readonly nodes: readonly string[];
  readonly queue: string;
  readonly deadLetterQueue: string;
  readonly prefetch: number;
  readonly partitions: number;
  /** TALLY_STREAM_CHECKPOINT_MS. */
  readonly checkpointMs: number;
  /** The id window's length to rebuild at a resume (TALLY_MARKER_TTL_S in ms); 0 with TALLY_STREAM_DEDUP off. */
  readonly windowMs: number;
  /** TALLY_FAULT_STREAM_OVERLAP: consume every partition, whatever the balancer says. */
  readonly overlap?: boolean;
  readonly handoffMs?: number;
}

export interface StreamSourceDeps {
  /** The watermarks and id windows, shared with the pipeline. */
  readonly state: StreamState;
  readonly checkpoints: CheckpointStore;
  /** stream_rollbacks, stream_gap_offsets. */
  readonly counters: Counters;
  /** The watermarks Redis holds for a partition, per shard asked (stream/watermark-audit.ts). */
  readWatermarks(partition: number, shards: readonly number[]): Promise<number[]>;
}

/** How long a probe of a stream's first or last offset waits for a delivery; none by then: an empty stream. */
const PROBE_WAIT_MS = 3_000;
/** A probe of the last offset reads until the stream has been quiet this long. */
const PROBE_QUIET_MS = 100;
/** The watermark audit runs every this many checkpoint intervals, and at most once a second. */
const AUDIT_CHECKPOINTS = 5;
const AUDIT_MIN_MS = 1_000;

type Lifecycle =
  | { readonly state: 'idle' }
  | { readonly state: 'connecting' }
  | { readonly state: 'consuming'; readonly control: ChannelLink }
  | { readonly state: 'stopping' }
  | { readonly state: 'closed' };

/** What a partition's link has read: its messages by delivery tag, until acked. */
interface LinkLog {
  readonly partition: number;
  readonly cursor: StreamCursor;
  readonly messages: Map<number, ConsumeMessage>;
  lowestTag: number;
}

/** The last committed run of a partition, not yet written. */
interface PendingCommit {
  readonly offset: number;
  readonly message: ConsumeMessage;
}

export class StreamSource implements MessageSource {
  private lifecycle: Lifecycle = { state: 'idle' };
  private generation = 0;
  private readonly connection: BrokerConnection;
  private readonly deadLetters: DeadLetterPublishing;
  private readonly partitions: PartitionChannels;
  private readonly logs = new WeakMap<ChannelLink, LinkLog>();
  /** Per partition: the latest committed run not yet written to Redis. */
  private readonly pending = new Map<number, PendingCommit>();
  /** Per partition: the rewinds count of the checkpoint this daemon resumed from (checkpoint-store.ts). */
  private readonly rewinds = new Map<number, number>();
  /** Per partition: a replay to start after this offset at the next subscription (a rollback found). */
  private readonly rewindTo = new Map<number, number>();
  /**
   * Per partition refused: why, the checkpoint it was refused at, and
   * whether the refusal stands until that checkpoint changes (`sticky`: the
   * checkpointed offset held another message, which is certain) or is
   * looked at again at every beat (what the stream's bounds said: a probe
   * of a slow broker may be wrong, and a refusal would stop the partition).
   */
  private readonly refused = new Map<number, { reason: string; checkpoint: string; sticky: boolean }>();
  /** Partitions whose stream was empty while a checkpoint exists: logged once, read once messages come. */
  private readonly waitingForMessages = new Set<number>();
  /** Per partition held: the stream's bounds as last probed, and the checkpoint last written (stream-gauges.ts). */
  private readonly figuresOf = new Map<number, { bounds: StreamBounds | null; committed: number | null; committedAtMs: number | null }>();
  /** Per partition: the checkpoint (offset:body:rewinds) its current subscription resumed from; a refusal lasts while it is unchanged. */
  private readonly resumedFrom = new Map<number, string>();
  private timer: NodeJS.Timeout | null = null;
  private auditTimer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> = Promise.resolve();

  constructor(
    private readonly options: StreamSourceOptions,
    private readonly deps: StreamSourceDeps,
    private readonly log: Logger,
    private readonly handlers: SourceHandlers,
  ) {
    this.connection = new BrokerConnection(
      { nodes: options.nodes, queue: options.queue, deadLetterQueue: options.deadLetterQueue, connectionName: `tally-coordinator-${process.pid}` },
      log,
      { prepare: (model) => this.declare(model), up: (model, node, index) => this.up(model, node, index), down: (reason) => this.down(reason) },
    );
    this.deadLetters = new DeadLetterPublishing(options.deadLetterQueue, log, () => this.connection.countUnroutable());
    this.partitions = new PartitionChannels(
      {
        queueOf: (partition) => this.streamOf(partition),
        prefetch: options.prefetch,
        ...(options.handoffMs === undefined ? {} : { handoffMs: options.handoffMs }),
      },
      log,
      {
        nextGeneration: () => ++this.generation,
        watch: (channel) => this.deadLetters.watch(channel),
        start: (partition, model) => this.startOf(partition, model),
        onDelivery: (link, message) => this.delivered(link, message),
        onLinkUp: (link) => this.handlers.onLinkUp(link),
        onLinkDown: (link, reason) => this.handlers.onLinkDown(link, reason),
        unackedOn: (link) => this.handlers.unackedOn?.(link) ?? 0,
        live: () => (this.lifecycle.state === 'consuming' ? this.connection.model : null),
        released: (link) => this.released(link),
      },
    );
  }

  /** The stream of a partition: `<queue>.<p>`, or `<queue>` itself with one partition. */
  streamOf(partition: number): string {
    return this.options.partitions === 1 ? this.options.queue : partitionQueue(this.options.queue, this.options.partitions, partition);
  }

  get connected(): boolean {
    const lifecycle = this.lifecycle;
    return lifecycle.state === 'consuming' && lifecycle.control.alive;
  }

  get consuming(): boolean {
    return this.connected && this.partitions.consumingAll;
  }

  get closing(): boolean {
    return this.lifecycle.state === 'closed';
  }

  get node(): string | null {
    return this.connection.node;
  }

  get brokerState(): AmqpBrokerState {
    return this.connection.brokerState;
  }

  get partitionsHeld(): number[] {
    return this.partitions.held;
  }

  /** Partitions refused (the stream is not the one checkpointed), with why: /readyz and tally status show them. */
  get refusedPartitions(): ReadonlyArray<{ partition: number; reason: string }> {
    return [...this.refused].map(([partition, { reason }]) => ({ partition, reason }));
  }

  assign(partitions: readonly number[]): void {
    if (this.lifecycle.state === 'stopping' || this.lifecycle.state === 'closed') return;
    // The fault suite's overlap: every daemon reads every partition at once.
    const owned = this.options.overlap === true ? Array.from({ length: this.options.partitions }, (_, p) => p) : partitions;
    this.partitions.assign(owned);
  }

  /** Streams have no single active consumer to get stuck behind (partition-channels.ts's watchdog is for queues). */
  checkIdlePartitions(): Promise<void> {
    return Promise.resolve();
  }

  async start(): Promise<void> {
    if (this.lifecycle.state !== 'idle') throw new Error(`start() called in state ${this.lifecycle.state}`);
    this.lifecycle = { state: 'connecting' };
    this.timer = setInterval(() => void this.flushCommits(), this.options.checkpointMs);
    this.timer.unref();
    this.auditTimer = setInterval(() => void this.audit(), Math.max(AUDIT_MIN_MS, AUDIT_CHECKPOINTS * this.options.checkpointMs));
    this.auditTimer.unref();
    await this.connection.start();
  }

  private async declare(model: ChannelModel): Promise<void> {
    const { queue, deadLetterQueue, partitions } = this.options;
    await declareTallyStreams(model, { queue, deadLetterQueue, partitions }, this.log);
  }

  private async up(model: ChannelModel, node: string, index: number): Promise<void> {
    // A channel that consumes nothing: the connection's liveness, and what tells the gauges it is up.
    const channel = await model.createConfirmChannel();
    channel.on('error', (error: Error) => this.log.warn({ err: describeError(error) }, 'amqp channel error'));
    const control: ChannelLink = { generation: ++this.generation, channel, alive: true };
    channel.on('close', () => {
      if (!control.alive) return;
      control.alive = false;
      const lifecycle = this.lifecycle;
      if (lifecycle.state === 'consuming' && lifecycle.control === control) this.connection.drop('channel closed');
    });
    if (this.lifecycle.state !== 'connecting') return;
    this.lifecycle = { state: 'consuming', control };
    this.log.info(
      {
        url: redactUrl(node),
        node: `${index + 1} of ${this.options.nodes.length}`,
        source: 'stream',
        streams: this.options.partitions === 1 ? this.options.queue : `${this.options.queue}.0..${this.options.partitions - 1}`,
      },
      'consuming',
    );
    this.partitions.reconnected();
  }

  private down(reason: string): void {
    const lifecycle = this.lifecycle;
    if (lifecycle.state === 'consuming') {
      lifecycle.control.alive = false;
      this.lifecycle = { state: 'connecting' };
    }
    this.partitions.allDown(reason);
  }

  /**
   * Where a partition starts: a replay after a rollback, or the resume plan
   * from its checkpoint and the stream's bounds (resume-plan.ts).
   */
  private async startOf(partition: number, model: ChannelModel): Promise<SubscriptionStart | null> {
    const { state, checkpoints } = this.deps;
    const rewindAfter = this.rewindTo.get(partition);
    if (rewindAfter !== undefined) {
      this.rewindTo.delete(partition);
      const countFrom = rewindAfter + 1;
      return this.subscription(partition, rewindAfter < 0 ? { kind: 'first' } : { kind: 'offset', offset: countFrom }, {
        partition,
        countFrom,
        confirm: null,
        mustSee: null,
      });
    }
    const checkpoint = await checkpoints.read(partition);
    const checkpointKey = checkpoint === null ? '' : `${checkpoint.offset}:${checkpoint.body}:${checkpoint.rewinds}`;
    const refusal = this.refused.get(partition);
    if (refusal !== undefined && refusal.sticky && refusal.checkpoint === checkpointKey) return null;
    this.resumedFrom.set(partition, checkpointKey);
    // A new partition needs no probe: it is read from its first message, whenever that comes.
    const bounds = checkpoint === null ? null : await probeBounds(model, this.streamOf(partition));
    if (checkpoint !== null && bounds === null) {
      // Empty, or a broker slow to answer: nothing to count yet, and nothing to decide on. Looked at again at the next beat.
      if (!this.waitingForMessages.has(partition))
        this.log.warn(
          { partition, stream: this.streamOf(partition), checkpoint: checkpoint.offset },
          'the stream delivered nothing to a probe; waiting for it before resuming the partition',
        );
      this.waitingForMessages.add(partition);
      return null;
    }
    this.waitingForMessages.delete(partition);
    const plan = planResume({ checkpoint, bounds, windowMs: this.options.windowMs });
    if (plan.kind === 'refuse') {
      this.refuse(partition, plan.reason, checkpointKey, false);
      return null;
    }
    if (refusal !== undefined) {
      this.refused.delete(partition);
      this.log.info({ partition, was: refusal.reason }, 'the refused partition holds its checkpoint again (or was reset): reading it');
    }
    this.rewinds.set(partition, checkpoint?.rewinds ?? 0);
    if (checkpoint !== null) state.expectAtLeast(partition, checkpoint.known);
    if (plan.lostOffsets > 0) {
      this.deps.counters.add('stream_gap_offsets', plan.lostOffsets);
      this.log.error(
        { partition, stream: this.streamOf(partition), checkpoint: checkpoint?.offset, firstLeft: bounds?.first, lostOffsets: plan.lostOffsets },
        `${plan.why}: those messages are lost to counting (tally_stream_gap_offsets); keep the stream's retention (x-max-age, x-max-length-bytes) longer than any lag (docs/streams.md)`,
      );
    }
    this.log.info({ partition, checkpoint: checkpoint?.offset ?? null, bounds, countFrom: plan.countFrom, why: plan.why }, 'partition resumes');
    return this.subscription(partition, plan.startAt, { partition, countFrom: plan.countFrom, confirm: plan.confirm, mustSee: plan.mustSee });
  }

  private subscription(partition: number, startAt: StartAt, cursorStart: ConstructorParameters<typeof ResumeCursor>[0]): SubscriptionStart {
    const cursor = new ResumeCursor(cursorStart, this.deps.state.of(partition).window, {
      onMismatch: (detail) =>
        this.refuse(partition, `the stream is not the one its checkpoint was taken on: ${detail}; it was deleted and recreated`, null, true),
      onGap: (after, next) => {
        this.deps.counters.add('stream_gap_offsets', next - after - 1);
        this.log.error(
          { partition, stream: this.streamOf(partition), after, next, lostOffsets: next - after - 1 },
          `retention deleted offsets ${after + 1} to ${next - 1} while they were being read: those messages are lost to counting (tally_stream_gap_offsets); keep the stream's retention (x-max-age, x-max-length-bytes) longer than any lag (docs/streams.md)`,
        );
      },
      onOvershoot: (firstOffset) => {
        this.log.warn(
          { partition, firstOffset, wanted: cursorStart.mustSee },
          'reading from the checkpoint time began past the checkpoint (the clocks disagree): reading again from the checkpoint offset, the id window not rebuilt',
        );
        if (cursorStart.mustSee !== null) this.rewindTo.set(partition, cursorStart.mustSee - 1);
        void this.partitions.resubscribe(partition, 'started past the checkpoint');
      },
    });
    const offsetArgument =
      startAt.kind === 'first' ? 'first' : startAt.kind === 'offset' ? startAt.offset : { '!': 'timestamp', value: Math.floor(startAt.epochMs / 1000) };
    return { arguments: { 'x-stream-offset': offsetArgument }, stream: cursor };
  }

  /**
   * The stream is not the one checkpointed: counting it from the checkpoint
   * would skip everything below it. The partition is left alone until its
   * checkpoint changes (`tally stream reset --partition P`).
   */
  private refuse(partition: number, reason: string, checkpointKey: string | null, sticky: boolean): void {
    const known = this.refused.get(partition);
    const key = checkpointKey ?? this.resumedFrom.get(partition) ?? known?.checkpoint ?? '';
    this.refused.set(partition, { reason, checkpoint: key, sticky });
    this.pending.delete(partition);
    // What was seen of the old stream means nothing for the new one (a reset makes its watermarks start over).
    this.deps.state.forget(partition);
    if (known === undefined)
      this.log.error(
        { partition, stream: this.streamOf(partition) },
        `partition ${partition} refused: ${reason}. Counting it from its checkpoint would skip everything below it. ` +
          `To count the new stream from its start, run \`tally stream reset --partition ${partition}\` (it may count messages a second time if they were published again); or use a new TALLY_PREFIX`,
      );
    void this.partitions.resubscribe(partition, 'partition refused');
  }

  private delivered(link: ChannelLink, message: ConsumeMessage): void {
    const cursor = link.stream;
    if (cursor !== undefined) {
      let log = this.logs.get(link);
      if (log === undefined) {
        log = { partition: cursor.partition, cursor, messages: new Map(), lowestTag: message.fields.deliveryTag };
        this.logs.set(link, log);
      }
      log.messages.set(message.fields.deliveryTag, message);
    }
    this.handlers.onDelivery(link, message);
  }

  /**
   * Acks `tag`: prefetch credit back. A multiple-ack also commits its
   * offset: every delivery up to it is finished (ack-tracker.ts).
   */
  ack(link: ChannelLink, tag: number, multiple = true): boolean {
    if (!link.alive) return false;
    try {
      link.channel.ack({ fields: { deliveryTag: tag } } as Message, multiple);
    } catch (error) {
      this.log.warn({ err: describeError(error), tag }, 'ack failed; the stream is read again from the checkpoint');
      return false;
    }
    const log = this.logs.get(link);
    if (log === undefined) return true;
    if (!multiple) {
      log.messages.delete(tag);
      return true;
    }
    const message = log.messages.get(tag);
    for (let t = log.lowestTag; t <= tag; t++) log.messages.delete(t);
    log.lowestTag = tag + 1;
    // A refused or rewound partition commits nothing more from this link.
    if (message !== undefined && log.cursor.trusted && !this.refused.has(log.partition) && !this.rewindTo.has(log.partition)) {
      const offset = message.properties.headers?.['x-stream-offset'] as number;
      this.pending.set(log.partition, { offset, message });
    }
    return true;
  }

  deadLetter(link: ChannelLink, message: ConsumeMessage, reason: string, headers: Record<string, unknown> = {}): Promise<void> {
    const sourceQueue = link.partition === undefined ? this.options.queue : this.streamOf(link.partition);
    const offset: unknown = message.properties.headers?.['x-stream-offset'];
    return this.deadLetters.publish(link, message, reason, sourceQueue, typeof offset === 'number' ? { ...headers, 'x-tally-source-offset': offset } : headers);
  }

  /**
   * A batch found a watermark below what this daemon had seen: Redis lost
   * acknowledged writes. The checkpoint moves back to it first (a crash
   * during the replay must not skip the range), then the partition is read
   * again from just after it. Several shards reporting one loss rewind once,
   * to the lowest.
   */
  rollback(partition: number, vshard: number, found: number, expected: number): void {
    const already = this.rewindTo.get(partition);
    if (already !== undefined && already <= found) return;
    const first = already === undefined;
    this.rewindTo.set(partition, already === undefined ? found : Math.min(already, found));
    this.pending.delete(partition);
    if (first) {
      this.deps.counters.add('stream_rollbacks');
      this.log.error(
        { partition, vshard, found, expected, stream: this.streamOf(partition) },
        'a watermark went backwards: Redis lost writes it had acknowledged (a failover without WAIT, a restart without AOF); replaying the partition from the log',
      );
    }
    // The link goes down at once: a part of it still waiting in a lane must not carry a watermark past the lost range.
    void this.partitions.resubscribe(partition, 'rewind');
    void this.deps.checkpoints
      .rewind(partition, found)
      .then((rewinds) => this.rewinds.set(partition, rewinds))
      .catch((error: unknown) => this.log.warn({ partition, err: describeError(error) }, 'moving the checkpoint back failed; the replay goes on'));
  }

  /** A released partition: its last committed run is written before its channel closes, and what this daemon knew of it goes. */
  private async released(link: ChannelLink): Promise<void> {
    const partition = link.partition;
    if (partition === undefined) return;
    await this.flushCommits([partition]);
    this.deps.state.forget(partition);
    this.rewinds.delete(partition);
  }

  /** Writes each partition's latest committed run (all partitions, or the ones named), and expires the id windows. */
  flushCommits(only?: readonly number[]): Promise<void> {
    this.flushing = this.flushing
      .then(() => this.flushOnce(only))
      .catch((error: unknown) => this.log.warn({ err: describeError(error) }, 'checkpoint commit failed; retrying'));
    return this.flushing;
  }

  private async flushOnce(only?: readonly number[]): Promise<void> {
    const { state, checkpoints } = this.deps;
    const now = Date.now();
    for (const partition of only ?? [...this.pending.keys()]) {
      const commit = this.pending.get(partition);
      if (commit === undefined) continue;
      const record = {
        offset: commit.offset,
        body: bodyHash(commit.message.content),
        at: now,
        known: state.knownOf(partition),
        rewinds: this.rewinds.get(partition) ?? 0,
      };
      const outcome = await checkpoints.commit(partition, record);
      if (this.pending.get(partition) === commit) this.pending.delete(partition);
      if (outcome.outcome !== 'rewound') {
        const figures = this.figuresOf.get(partition) ?? { bounds: null, committed: null, committedAtMs: null };
        const published = timestampToMs(commit.message.properties.timestamp);
        this.figuresOf.set(partition, {
          ...figures,
          committed: outcome.outcome === 'written' ? commit.offset : (outcome.found?.offset ?? commit.offset),
          committedAtMs: published ?? null,
        });
      }
      if (outcome.outcome === 'rewound') {
        // Another daemon rewound the partition (it found lost writes): read it again from the rewound checkpoint too.
        this.log.warn(
          { partition, found: outcome.found?.offset, rewinds: outcome.found?.rewinds },
          'partition rewound by another daemon; resuming from its checkpoint',
        );
        this.pending.delete(partition);
        void this.partitions.resubscribe(partition, 'rewound elsewhere');
      }
    }
    if (only === undefined) for (const partition of this.partitions.held) state.of(partition).window?.expire(now);
  }

  /**
   * Compares the watermarks Redis holds with those this daemon has seen, for
   * every partition it holds: one lower means Redis lost writes (a restart
   * from an older snapshot, a failover without WAIT), found here even on a
   * shard no batch will reach again. The seen ones are taken before the
   * read: a batch landing meanwhile only raises what Redis holds.
   */
  audit(): Promise<void> {
    this.flushing = this.flushing
      .then(() => this.auditOnce())
      .catch((error: unknown) => this.log.warn({ err: describeError(error) }, 'watermark audit failed; retrying'));
    return this.flushing;
  }

  private async auditOnce(): Promise<void> {
    const { state } = this.deps;
    for (const partition of this.partitions.held) {
      if (this.rewindTo.has(partition)) continue;
      const seen = Array.from(state.of(partition).known);
      const shards = seen.flatMap((watermark, vshard) => (watermark >= 0 ? [vshard] : []));
      const held = await this.deps.readWatermarks(partition, shards);
      shards.forEach((vshard, i) => {
        if (held[i]! < seen[vshard]!) state.rolledBack(partition, vshard, held[i]!, seen[vshard]!);
      });
    }
    // The gauges' figures: each held partition's bounds, probed on this daemon's connection.
    const model = this.connection.model;
    if (model === null) return;
    for (const partition of this.partitions.held) {
      const bounds = await probeBounds(model, this.streamOf(partition)).catch(() => null);
      const figures = this.figuresOf.get(partition) ?? { bounds: null, committed: null, committedAtMs: null };
      this.figuresOf.set(partition, { ...figures, bounds });
    }
    for (const partition of this.figuresOf.keys()) if (!this.partitions.held.includes(partition)) this.figuresOf.delete(partition);
  }

  /** Per partition held: what the gauges show (telemetry/stream-gauges.ts). */
  figures(nowMs = Date.now()): StreamFigures[] {
    return [...this.figuresOf].map(([partition, { bounds, committed, committedAtMs }]) => {
      const behind = bounds !== null && bounds.last > (committed ?? -1);
      return {
        partition,
        first: bounds?.first ?? null,
        last: bounds?.last ?? null,
        committed,
        lagSeconds: !behind ? 0 : committedAtMs === null ? null : Math.max(0, (nowMs - committedAtMs) / 1000),
      };
    });
  }

  async stopConsuming(timeoutMs = 1_000): Promise<void> {
    const lifecycle = this.lifecycle;
    if (lifecycle.state === 'closed' || lifecycle.state === 'stopping') return;
    this.connection.stopping();
    this.lifecycle = { state: 'stopping' };
    await this.partitions.cancelAll(timeoutMs);
  }

  /** The last commits written (Redis is closed after the source), then the channels and the connection. */
  async close(timeoutMs = 1_000): Promise<void> {
    const lifecycle = this.lifecycle;
    if (lifecycle.state === 'closed') return;
    this.lifecycle = { state: 'closed' };
    if (this.timer !== null) clearInterval(this.timer);
    if (this.auditTimer !== null) clearInterval(this.auditTimer);
    const started = performance.now();
    const left = () => Math.max(0, timeoutMs - (performance.now() - started));
    if ((await within(left(), this.flushCommits())) === TIMED_OUT)
      this.log.warn({ timeoutMs }, 'the last checkpoint commit did not finish in time; the next owner reads a little more again');
    await this.partitions.closeAll(left());
    if (lifecycle.state === 'consuming' && lifecycle.control.alive) {
      lifecycle.control.alive = false;
      await within(
        left(),
        lifecycle.control.channel.close().catch(() => {}),
      );
    }
    await this.connection.close(left());
  }
}

/**
 * A stream's first and last offsets, read by two short consumers of its
 * own: the first delivery from `first`, and the highest delivery from
 * `last` (the last chunk) once the stream is quiet. null when nothing comes:
 * an empty stream.
 */
export async function probeBounds(model: ChannelModel, stream: string): Promise<StreamBounds | null> {
  const first = await probe(model, stream, 'first', true);
  if (first === null) return null;
  const last = await probe(model, stream, 'last', false);
  return { first, last: Math.max(first, last ?? first) };
}

async function probe(model: ChannelModel, stream: string, from: 'first' | 'last', firstOnly: boolean): Promise<number | null> {
  const channel: Channel = await model.createChannel();
  channel.on('error', () => {});
  try {
    await channel.prefetch(1_000);
    let best: number | null = null;
    let quietTimer: NodeJS.Timeout | null = null;
    const done = new Promise<void>((resolve) => {
      const overall = setTimeout(resolve, PROBE_WAIT_MS);
      const settle = () => {
        clearTimeout(overall);
        resolve();
      };
      void channel
        .consume(
          stream,
          (message) => {
            if (message === null) return settle();
            const offset = message.properties.headers?.['x-stream-offset'];
            channel.ack(message);
            // Deliveries go on until the channel closes: the first one is the stream's first offset, the highest its last.
            if (firstOnly && best !== null) return;
            if (typeof offset === 'number' && (best === null || offset > best)) best = offset;
            if (firstOnly) return settle();
            if (quietTimer !== null) clearTimeout(quietTimer);
            quietTimer = setTimeout(settle, PROBE_QUIET_MS);
          },
          { noAck: false, arguments: { 'x-stream-offset': from } },
        )
        .catch(() => settle());
    });
    await done;
    if (quietTimer !== null) clearTimeout(quietTimer);
    return best;
  } finally {
    await channel.close().catch(() => {});
  }
}
