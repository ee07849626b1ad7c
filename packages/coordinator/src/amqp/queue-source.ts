/**
 * The source of a queue (TALLY_SOURCE=queue): on each connection of its
 * BrokerConnection, one confirm channel that consumes the queue and
 * publishes its dead letters, or with partitioned queues (TALLY_PARTITIONS
 * > 1) one confirm channel per partition the daemon holds
 * (partition-channels.ts), the first channel then consuming nothing.
 *
 * Every channel is a ChannelLink with a new generation. Delivery tags are
 * per channel, so a delivery is only ever acked on the link it came from;
 * when a link dies its unacked deliveries are simply redelivered by the
 * broker, and the markers (or the in-flight id hold) recognise them. One
 * channel per partition keeps every partition's tags gapless and its acks
 * exact on their own (ack-window.ts), and closing one channel hands exactly
 * one partition over: a classic single-active-consumer queue activates the
 * next consumer only when the active one's channel closes.
 */
import type { ChannelModel, ConsumeMessage, Message } from 'amqplib';
import { describeError, partitionQueue, redactUrl, type QueueType } from '@tally/shared';
import type { ChannelLink } from '../pipeline/delivery.js';
import { within, TIMED_OUT } from '../process/deadline.js';
import type { Logger } from '../process/logger.js';
import { BrokerConnection } from './broker-connection.js';
import { DeadLetterPublishing } from './dead-letter-publishing.js';
import type { AmqpBrokerState, MessageSource, SourceHandlers } from './message-source.js';
import { PartitionChannels } from './partition-channels.js';
import { declareTallyQueues } from './queue-declaration.js';

export interface QueueSourceOptions {
  /** The nodes of TALLY_AMQP_URL, in order (one for a single broker): tried from the first. */
  readonly nodes: readonly string[];
  readonly queue: string;
  readonly deadLetterQueue: string;
  readonly prefetch: number;
  /** TALLY_QUEUE_TYPE and TALLY_DELIVERY_LIMIT; see queue-declaration.ts. Classic when absent. */
  readonly queueType?: QueueType;
  readonly deliveryLimit?: number;
  /** TALLY_PARTITIONS; 1 (consume `queue` itself) when absent. */
  readonly partitions?: number;
  /** How long a released partition's channel stays open for its deliveries to be acked (partition-channels.ts). */
  readonly handoffMs?: number;
}

/**
 * Where the source is:
 * - idle: not started;
 * - connecting: no live channel (first connect, or after a loss);
 * - consuming: a live channel (the consumer on it, or partition channels beside it);
 * - stopping: consumers cancelled, channels kept so what is in flight can be acked;
 * - closed.
 */
type Lifecycle =
  | { readonly state: 'idle' }
  | { readonly state: 'connecting' }
  | { readonly state: 'consuming'; readonly link: ChannelLink; readonly consumerTag: string | null }
  | { readonly state: 'stopping'; readonly link: ChannelLink | null }
  | { readonly state: 'closed' };

export class QueueSource implements MessageSource {
  private lifecycle: Lifecycle = { state: 'idle' };
  private generation = 0;
  private readonly connection: BrokerConnection;
  private readonly deadLetters: DeadLetterPublishing;
  /** TALLY_PARTITIONS > 1: the partition subscriptions; null with one queue. */
  private readonly partitions: PartitionChannels | null;

  constructor(
    private readonly options: QueueSourceOptions,
    private readonly log: Logger,
    private readonly handlers: SourceHandlers,
  ) {
    this.connection = new BrokerConnection(
      { nodes: options.nodes, queue: options.queue, deadLetterQueue: options.deadLetterQueue, connectionName: `tally-coordinator-${process.pid}` },
      log,
      { prepare: (model) => this.declare(model), up: (model, node, index) => this.up(model, node, index), down: (reason) => this.down(reason) },
    );
    this.deadLetters = new DeadLetterPublishing(options.deadLetterQueue, log, () => this.connection.countUnroutable());
    const partitions = options.partitions ?? 1;
    this.partitions =
      partitions > 1
        ? new PartitionChannels(
            {
              queueOf: (partition) => partitionQueue(options.queue, partitions, partition),
              prefetch: options.prefetch,
              ...(options.handoffMs === undefined ? {} : { handoffMs: options.handoffMs }),
            },
            log,
            {
              nextGeneration: () => ++this.generation,
              watch: (channel) => this.deadLetters.watch(channel),
              start: () => ({ arguments: {} }),
              onDelivery: (link, message) => this.handlers.onDelivery(link, message),
              onLinkUp: (link) => this.handlers.onLinkUp(link),
              onLinkDown: (link, reason) => this.handlers.onLinkDown(link, reason),
              unackedOn: (link) => this.handlers.unackedOn?.(link) ?? 0,
              live: () => (this.lifecycle.state === 'consuming' ? this.connection.model : null),
            },
          )
        : null;
  }

  get connected(): boolean {
    const lifecycle = this.lifecycle;
    return lifecycle.state === 'consuming' && lifecycle.link.alive;
  }

  get brokerState(): AmqpBrokerState {
    return this.connection.brokerState;
  }

  get node(): string | null {
    return this.connection.node;
  }

  get consuming(): boolean {
    const lifecycle = this.lifecycle;
    if (lifecycle.state !== 'consuming' || !lifecycle.link.alive) return false;
    // Partitioned: subscribed to every partition it owns (none, for a daemon beyond N: a standby).
    return this.partitions === null ? lifecycle.consumerTag !== null : this.partitions.consumingAll;
  }

  get partitionsHeld(): number[] {
    return this.partitions?.held ?? [];
  }

  get closing(): boolean {
    return this.lifecycle.state === 'closed';
  }

  assign(partitions: readonly number[]): void {
    if (this.lifecycle.state === 'stopping' || this.lifecycle.state === 'closed') return;
    this.partitions?.assign(partitions);
  }

  checkIdlePartitions(idleMs: number): Promise<void> {
    return this.lifecycle.state === 'consuming' ? (this.partitions?.checkIdle(idleMs) ?? Promise.resolve()) : Promise.resolve();
  }

  async start(): Promise<void> {
    if (this.lifecycle.state !== 'idle') throw new Error(`start() called in state ${this.lifecycle.state}`);
    this.lifecycle = { state: 'connecting' };
    await this.connection.start();
  }

  /**
   * Declares the work queue (or the partitions and their exchange) and
   * `<queue>.dead` as durable queues of TALLY_QUEUE_TYPE; a queue that
   * exists with other arguments is used as it is, and what was found is logged.
   */
  private async declare(model: ChannelModel): Promise<void> {
    const { queue, deadLetterQueue, queueType = 'classic', deliveryLimit = 20, partitions = 1 } = this.options;
    await declareTallyQueues(model, { queue, deadLetterQueue, queueType, deliveryLimit, partitions }, this.log);
  }

  private async up(model: ChannelModel, node: string, index: number): Promise<void> {
    const channel = await model.createConfirmChannel();
    channel.on('error', (error: Error) => this.log.warn({ err: describeError(error) }, 'amqp channel error'));
    await channel.prefetch(this.options.prefetch);
    const link: ChannelLink = { generation: ++this.generation, channel, alive: true };
    // The first channel gone means the connection is of no use: reconnect (to the next node).
    channel.on('close', () => this.linkLost(link, 'channel closed'));
    this.deadLetters.watch(channel);
    const where = { url: redactUrl(node), node: `${index + 1} of ${this.options.nodes.length}` };
    if (this.partitions !== null) {
      this.lifecycle = { state: 'consuming', link, consumerTag: null };
      this.log.info({ ...where, exchange: this.options.queue, partitions: this.options.partitions }, 'consuming');
      this.partitions.reconnected();
      return;
    }
    this.handlers.onLinkUp(link);
    const { consumerTag } = await channel.consume(
      this.options.queue,
      (message: ConsumeMessage | null) => {
        // The broker cancelled us (queue deleted): treat it as a lost connection.
        if (message === null) this.linkLost(link, 'consumer cancelled by the broker');
        else this.handlers.onDelivery(link, message);
      },
      { noAck: false },
    );
    if (this.lifecycle.state !== 'connecting') {
      // A stop came while the consumer was being set up: it must not go on delivering.
      await channel.cancel(consumerTag).catch(() => {});
      return;
    }
    this.lifecycle = { state: 'consuming', link, consumerTag };
    this.log.info({ ...where, queue: this.options.queue, prefetch: this.options.prefetch, generation: link.generation }, 'consuming');
  }

  /** A link is gone: its deliveries go back to the broker. The live one lost while consuming takes the connection with it (a reconnect). */
  private linkLost(link: ChannelLink, reason: string): void {
    if (!link.alive) return;
    link.alive = false;
    if (this.partitions === null) this.handlers.onLinkDown(link, reason);
    const lifecycle = this.lifecycle;
    if (lifecycle.state === 'consuming' && lifecycle.link === link) this.connection.drop(reason);
  }

  /** The connection went away with every channel on it: their deliveries go back to the broker. */
  private down(reason: string): void {
    const lifecycle = this.lifecycle;
    const link = lifecycle.state === 'consuming' || lifecycle.state === 'stopping' ? lifecycle.link : null;
    if (lifecycle.state === 'consuming') this.lifecycle = { state: 'connecting' };
    else if (lifecycle.state === 'stopping') this.lifecycle = { state: 'stopping', link: null };
    this.partitions?.allDown(reason);
    if (link !== null) this.linkLost(link, reason);
  }

  /**
   * Acks `tag` on `link`: with `multiple`, every outstanding delivery up to
   * it (the normal path); without, that one delivery only (behind a stalled
   * head, see ack-tracker.ts). A dead link's deliveries are left to redelivery.
   */
  ack(link: ChannelLink, tag: number, multiple = true): boolean {
    if (!link.alive) return false;
    try {
      link.channel.ack({ fields: { deliveryTag: tag } } as Message, multiple);
      return true;
    } catch (error) {
      this.log.warn({ err: describeError(error), tag }, 'ack failed; the broker will redeliver');
      return false;
    }
  }

  deadLetter(link: ChannelLink, message: ConsumeMessage, reason: string, headers: Record<string, unknown> = {}): Promise<void> {
    const { queue, partitions = 1 } = this.options;
    // The partition queue it came from: a replay must return it there (dead-queue.ts), where its markers' copies go.
    const sourceQueue = link.partition === undefined ? queue : partitionQueue(queue, partitions, link.partition);
    return this.deadLetters.publish(link, message, reason, sourceQueue, headers);
  }

  /** Stops new deliveries; what is in flight stays acknowledgeable. Waits at most `timeoutMs` for the broker's cancel-ok. */
  async stopConsuming(timeoutMs = 1_000): Promise<void> {
    const lifecycle = this.lifecycle;
    if (lifecycle.state === 'closed' || lifecycle.state === 'stopping') return;
    this.connection.stopping();
    const link = lifecycle.state === 'consuming' ? lifecycle.link : null;
    this.lifecycle = { state: 'stopping', link };
    await this.partitions?.cancelAll(timeoutMs);
    const tag = lifecycle.state === 'consuming' ? lifecycle.consumerTag : null;
    if (link?.alive && tag !== null) {
      const cancelled = await within(
        timeoutMs,
        link.channel.cancel(tag).catch((error) => this.log.warn({ err: describeError(error) }, 'cancel failed')),
      );
      if (cancelled === TIMED_OUT) this.log.warn({ timeoutMs }, 'the broker did not confirm the cancel in time; going on with the stop');
    }
  }

  /**
   * Closes the channels, then the connection, each waiting at most
   * `timeoutMs` for the broker. Unacked deliveries are requeued by the broker either way.
   */
  async close(timeoutMs = 1_000): Promise<void> {
    const lifecycle = this.lifecycle;
    if (lifecycle.state === 'closed') return;
    this.lifecycle = { state: 'closed' };
    const link = lifecycle.state === 'consuming' || lifecycle.state === 'stopping' ? lifecycle.link : null;
    const started = performance.now();
    const left = () => Math.max(0, timeoutMs - (performance.now() - started));
    await this.partitions?.closeAll(left());
    if (link?.alive) {
      const closed = await within(
        left(),
        link.channel.close().catch((error: unknown) => this.log.warn({ err: describeError(error) }, 'closing the amqp channel failed')),
      );
      if (closed === TIMED_OUT) this.log.warn({ timeoutMs }, 'the broker did not confirm the channel close in time');
    }
    if (link !== null) this.linkLost(link, 'channel closed');
    await this.connection.close(left());
  }
}
