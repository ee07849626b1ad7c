/**
 * The partitions a daemon consumes (TALLY_PARTITIONS > 1), one confirm
 * channel each on the source's connection, with its own consumer, prefetch
 * and delivery tags. assign() says which partitions this daemon owns now
 * (fleet/partition-balancer.ts); the subscriptions follow, one change at a
 * time: new partitions subscribed, released ones handed over.
 *
 * A handover cancels the consumer (no new deliveries), lets what the
 * channel holds finish and be acked for up to handoffMs, then closes the
 * channel. What is still unacked goes back to the broker and to the next
 * owner. On a queue, single active consumer keeps the next owner waiting
 * until then; on a stream (no single active consumer there) the next owner
 * may read the partition meanwhile, and the watermarks keep that exact.
 */
import type { Channel, ChannelModel, ConsumeMessage } from 'amqplib';
import { describeError } from '@tally/shared';
import type { ChannelLink } from '../pipeline/delivery.js';
import type { StreamCursor } from '../stream/stream-cursor.js';
import { within, TIMED_OUT } from '../process/deadline.js';
import type { Logger } from '../process/logger.js';
import { PARTITION_RELEASED } from './message-source.js';

/** How long a released partition waits for its deliveries to be acked before its channel closes. */
export const PARTITION_HANDOFF_MS = 5_000;

export interface PartitionChannelsOptions {
  /** The queue or stream of a partition. */
  queueOf(partition: number): string;
  readonly prefetch: number;
  /** PARTITION_HANDOFF_MS by default. */
  readonly handoffMs?: number;
}

/** How a partition's consumer starts: its arguments (a stream's start offset) and, on a stream, the cursor its link carries. */
export interface SubscriptionStart {
  readonly arguments: Record<string, unknown>;
  readonly stream?: StreamCursor;
}

export interface PartitionChannelsHooks {
  nextGeneration(): number;
  /** A new channel that may publish dead letters (dead-letter-publishing.ts watches its returns). */
  watch(channel: Channel): void;
  /** How a partition about to be subscribed starts; null: not now (the next assign() tries again). */
  start(partition: number, model: ChannelModel): Promise<SubscriptionStart | null> | SubscriptionStart | null;
  onDelivery(link: ChannelLink, message: ConsumeMessage): void;
  onLinkUp(link: ChannelLink): void;
  onLinkDown(link: ChannelLink, reason: string): void;
  unackedOn(link: ChannelLink): number;
  /** The source's live connection while it consumes; null otherwise (nothing is subscribed then). */
  live(): ChannelModel | null;
  /** Called once a released partition's deliveries are acked (or handoffMs passed), before its channel closes. */
  released?(link: ChannelLink): Promise<void>;
}

/** One partition's subscription. */
interface Subscription {
  readonly link: ChannelLink;
  consumerTag: string | null;
  /** Being handed over: cancelled, finishing what it holds, then closed. */
  releasing: boolean;
  /** performance.now() of its subscription or its last delivery: an idle subscription over a non-empty queue is resubscribed. */
  lastDeliveryAt: number;
}

export class PartitionChannels {
  private desired = new Set<number>();
  private readonly subscriptions = new Map<number, Subscription>();
  /** assign() and reconnects reconcile one at a time. */
  private reconciling: Promise<void> = Promise.resolve();

  constructor(
    private readonly options: PartitionChannelsOptions,
    private readonly log: Logger,
    private readonly hooks: PartitionChannelsHooks,
  ) {}

  /** Subscribed to every partition it owns (none, for a daemon beyond N: a standby). */
  get consumingAll(): boolean {
    for (const p of this.desired) if (this.subscriptions.get(p)?.consumerTag == null) return false;
    return true;
  }

  /** The partitions subscribed and not being handed over, ascending (the heartbeat's `partitions`). */
  get held(): number[] {
    return [...this.subscriptions.entries()]
      .filter(([, sub]) => !sub.releasing && sub.link.alive)
      .map(([p]) => p)
      .sort((a, b) => a - b);
  }

  /** The live link of a partition, when subscribed and not being handed over. */
  linkOf(partition: number): ChannelLink | null {
    const sub = this.subscriptions.get(partition);
    return sub !== undefined && !sub.releasing && sub.link.alive ? sub.link : null;
  }

  /** The partitions this daemon owns now: subscribes to the new ones, hands over the others. */
  assign(partitions: readonly number[]): void {
    this.desired = new Set(partitions);
    this.reconcile();
  }

  /** A new connection: subscribe again to what this daemon owns. */
  reconnected(): void {
    this.reconcile();
  }

  private reconcile(): void {
    this.reconciling = this.reconciling
      .then(() => this.reconcileOnce())
      .catch((error) => this.log.warn({ err: describeError(error) }, 'partition subscription failed; retrying at the next beat'));
  }

  private async reconcileOnce(): Promise<void> {
    const model = this.hooks.live();
    if (model === null) return;
    for (const [p, sub] of this.subscriptions) if (!this.desired.has(p) && !sub.releasing) void this.release(p, sub);
    for (const p of [...this.desired].sort((a, b) => a - b)) {
      if (this.subscriptions.has(p)) continue;
      if (this.hooks.live() !== model) return;
      await this.subscribe(model, p);
    }
  }

  private async subscribe(model: ChannelModel, partition: number): Promise<void> {
    const start = await this.hooks.start(partition, model);
    if (start === null || this.hooks.live() !== model || !this.desired.has(partition) || this.subscriptions.has(partition)) return;
    const queue = this.options.queueOf(partition);
    const channel = await model.createConfirmChannel();
    channel.on('error', (error: Error) => this.log.warn({ partition, err: describeError(error) }, 'amqp channel error'));
    await channel.prefetch(this.options.prefetch);
    const link: ChannelLink = {
      generation: this.hooks.nextGeneration(),
      channel,
      alive: true,
      partition,
      ...(start.stream === undefined ? {} : { stream: start.stream }),
    };
    const sub: Subscription = { link, consumerTag: null, releasing: false, lastDeliveryAt: performance.now() };
    this.subscriptions.set(partition, sub);
    channel.on('close', () => this.down(sub, sub.releasing ? PARTITION_RELEASED : 'channel closed'));
    this.hooks.watch(channel);
    this.hooks.onLinkUp(link);
    const { consumerTag } = await channel.consume(
      queue,
      (message) => {
        if (message === null) {
          // The broker cancelled the consumer (queue deleted): close the channel; the next beat subscribes again.
          void channel.close().catch(() => {});
          return;
        }
        sub.lastDeliveryAt = performance.now();
        this.hooks.onDelivery(link, message);
      },
      { noAck: false, arguments: start.arguments },
    );
    sub.consumerTag = consumerTag;
    this.log.info({ partition, queue, generation: link.generation, ...start.arguments }, 'partition subscribed');
  }

  /** Hands a partition over: cancel, let what it holds be acked for up to handoffMs, then close its channel. */
  private async release(partition: number, sub: Subscription): Promise<void> {
    sub.releasing = true;
    const { link } = sub;
    const tag = sub.consumerTag;
    if (link.alive && tag !== null) {
      await within(
        1_000,
        link.channel.cancel(tag).catch((error) => this.log.warn({ partition, err: describeError(error) }, 'cancel failed')),
      );
    }
    const until = performance.now() + (this.options.handoffMs ?? PARTITION_HANDOFF_MS);
    while (link.alive && this.hooks.unackedOn(link) > 0 && performance.now() < until) await new Promise((resolve) => setTimeout(resolve, 50));
    const left = this.hooks.unackedOn(link);
    await this.hooks.released?.(link).catch((error: unknown) => this.log.warn({ partition, err: describeError(error) }, 'release step failed'));
    this.log.info({ partition, unackedLeft: left, generation: link.generation }, 'partition released');
    if (link.alive)
      await within(
        1_000,
        link.channel.close().catch(() => {}),
      );
    this.down(sub, PARTITION_RELEASED);
  }

  /**
   * Closes a partition's channel for a reason of the source's own (a stream
   * replayed from an earlier offset): the next reconcile subscribes it again.
   */
  async resubscribe(partition: number, reason: string): Promise<void> {
    const sub = this.subscriptions.get(partition);
    if (sub === undefined || sub.releasing) return;
    sub.releasing = true;
    const { channel } = sub.link;
    // Down at once, before the broker confirms the close: nothing of this link may be acked or written from now on.
    this.down(sub, reason);
    await within(
      1_000,
      channel.close().catch(() => {}),
    );
    this.reconcile();
  }

  /**
   * A watchdog over the subscriptions: one that has received nothing for
   * `idleMs`, holds nothing unacked, and whose queue has ready messages is
   * closed and subscribed again. Seen on RabbitMQ 3.10.8 with classic SAC
   * queues when two daemons started together swapped partitions: the broker
   * listed the remaining consumer as active with nothing unacked and 2,000
   * ready, and delivered nothing until the consumer was replaced. (A
   * subscription that merely waits behind another daemon's active consumer
   * goes to the back of the line, which costs nothing.)
   */
  async checkIdle(idleMs: number): Promise<void> {
    const model = this.hooks.live();
    if (model === null) return;
    const now = performance.now();
    for (const [partition, sub] of this.subscriptions) {
      if (sub.releasing || sub.consumerTag === null || !sub.link.alive || now - sub.lastDeliveryAt < idleMs) continue;
      if (this.hooks.unackedOn(sub.link) > 0) continue;
      const queue = this.options.queueOf(partition);
      const probe = await model.createChannel();
      probe.on('error', () => {});
      const { messageCount } = await probe.checkQueue(queue).finally(() => probe.close().catch(() => {}));
      if (messageCount === 0 || sub.releasing || !sub.link.alive) {
        sub.lastDeliveryAt = performance.now();
        continue;
      }
      this.log.warn(
        { partition, queue, ready: messageCount, idleMs: Math.round(now - sub.lastDeliveryAt) },
        'partition idle with ready messages; subscribing again',
      );
      await this.resubscribe(partition, 'resubscribing an idle partition');
    }
  }

  private down(sub: Subscription, reason: string): void {
    const { link } = sub;
    if (!link.alive) return;
    link.alive = false;
    if (this.subscriptions.get(link.partition!) === sub) this.subscriptions.delete(link.partition!);
    this.hooks.onLinkDown(link, reason);
    // A channel lost while the connection lives (a channel error): subscribe again soon if it is still ours.
    if (reason !== PARTITION_RELEASED && this.hooks.live() !== null) setTimeout(() => this.reconcile(), 1_000).unref();
  }

  /** The connection is gone with every partition channel on it: their deliveries go back to the broker. */
  allDown(reason: string): void {
    for (const sub of [...this.subscriptions.values()]) this.down(sub, reason);
  }

  /** Every consumer cancelled (a stop), channels kept open so what is in flight can still be acked. */
  async cancelAll(timeoutMs: number): Promise<void> {
    const cancels = [...this.subscriptions.values()].map(async (sub) => {
      const tag = sub.consumerTag;
      sub.consumerTag = null;
      if (sub.link.alive && tag !== null) await sub.link.channel.cancel(tag).catch(() => {});
    });
    if (cancels.length > 0 && (await within(timeoutMs, Promise.all(cancels))) === TIMED_OUT) {
      this.log.warn({ timeoutMs }, 'the broker did not confirm the partition cancels in time; going on with the stop');
    }
  }

  /** Closes every partition channel, waiting at most `timeoutMs`. */
  async closeAll(timeoutMs: number): Promise<void> {
    const closes = [...this.subscriptions.values()].filter((sub) => sub.link.alive).map((sub) => sub.link.channel.close().catch(() => {}));
    if (closes.length > 0 && (await within(timeoutMs, Promise.all(closes))) === TIMED_OUT) {
      this.log.warn({ timeoutMs }, 'the broker did not confirm the partition channel closes in time');
    }
  }
}
