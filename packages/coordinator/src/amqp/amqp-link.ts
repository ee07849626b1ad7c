/**
 * The RabbitMQ edge: one connection, one confirm channel used both to consume
 * and to publish dead letters, reconnected with backoff when it goes away.
 *
 * Every (re)connection is a new ChannelLink with a new generation. Delivery
 * tags are per channel, so a delivery is only ever acked on the link it came
 * from; when a link dies its unacked deliveries are simply redelivered by the
 * broker, and the markers (or the in-flight id hold) recognise them.
 *
 * With partitioned queues (TALLY_PARTITIONS > 1) the connection carries one
 * confirm channel per partition the daemon holds (assign()), each with its
 * own consumer, prefetch and delivery tags, besides the first channel, which
 * then consumes nothing. Delivery tags are numbered per channel, so one
 * channel per partition keeps every partition's tags gapless and its acks
 * exact on their own (ack-window.ts), and closing one channel hands exactly
 * one partition over: a classic single-active-consumer queue activates the
 * next consumer only when the active one's channel closes.
 *
 * With several nodes of one cluster (TALLY_AMQP_URL as a list), each failed
 * connect and each lost link moves to the next node (nextNodeIndex), with
 * the same backoff between attempts: a node that is gone for good costs one
 * failed attempt per round, never a wait on it alone.
 */
import { randomUUID } from 'node:crypto';
import amqp, { type ChannelModel, type ConfirmChannel, type ConsumeMessage, type Message } from 'amqplib';
import { DEAD_AT_HEADER, describeError, nextNodeIndex, partitionQueue, redactUrl, retryUntilDone, TallyError, type QueueType } from '@tally/shared';
import { amqpReplyCode, classifyBrokerRefusal, type BrokerTarget } from './broker-refusal.js';
import type { ChannelLink } from '../pipeline/delivery.js';
import type { AmqpBrokerState, MessageSource, SourceHandlers } from './message-source.js';
import type { Logger } from '../process/logger.js';
import { declareTallyQueues } from './queue-declaration.js';
import { within, TIMED_OUT } from '../process/deadline.js';
import { copyPublishOptions } from './message-copy.js';

export interface AmqpLinkOptions {
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
  /**
   * How long a released partition's channel stays open for its deliveries
   * to finish and be acked before it is closed (what is left is redelivered
   * to the next owner). PARTITION_HANDOFF_MS by default.
   */
  readonly handoffMs?: number;
}

/** How long a released partition waits for its deliveries to be acked before its channel closes. */
export const PARTITION_HANDOFF_MS = 5_000;

/** The reason onLinkDown gives for a partition this daemon handed over: not a loss. */
export const PARTITION_RELEASED = 'partition released';

/** One partition's subscription: its own confirm channel and consumer. */
interface PartitionSubscription {
  readonly link: ChannelLink;
  consumerTag: string | null;
  /** Being handed over: cancelled, finishing what it holds, then closed. */
  releasing: boolean;
  /** performance.now() of its subscription or its last delivery: an idle subscription over a non-empty queue is resubscribed. */
  lastDeliveryAt: number;
}

type LinkState = 'idle' | 'connecting' | 'consuming' | 'stopping' | 'closed';

/**
 * Correlates a returned dead-letter copy with its publish: the broker sends
 * basic.return before the confirm of the same message, and several copies
 * may be in flight, so each copy carries its own id.
 */
const DEAD_LETTER_ID_HEADER = 'x-tally-dead-letter-id';

/** A dead-letter copy the broker could not route: not kept, so its original must not be acked. */
export class UnroutableDeadLetterError extends Error {
  constructor(queue: string, replyText: string) {
    super(
      `dead-letter copy returned unroutable (${replyText}): queue ${queue} does not exist; the original stays unacked and is retried; ` +
        `declare ${queue} again (a durable queue) or restart Tally, which declares it`,
    );
    this.name = 'UnroutableDeadLetterError';
  }
}

export class AmqpLink implements MessageSource {
  private state: LinkState = 'idle';
  private model: ChannelModel | null = null;
  private link: ChannelLink | null = null;
  private consumerTag: string | null = null;
  private generation = 0;
  private everConnected = false;
  /** The node the next connect goes to; moved on by every failed connect and every lost link. */
  private nodeIndex = 0;
  /** The node of the live connection; null while there is none. */
  private connectedNode: string | null = null;
  private blocked: { reason: string; since: Date } | null = null;
  private unroutableDeadLetters = 0;
  /** Ids of dead-letter copies the broker returned and whose confirm has not come yet. */
  private readonly returnedDeadLetters = new Set<string>();
  /** The first dead-letter attempt's time per message (x-tally-dead-at); gone with the message. */
  private readonly deadLetterAttempts = new WeakMap<ConsumeMessage, number>();
  /** TALLY_PARTITIONS > 1: the partitions this daemon should consume (assign()), and those it is subscribed to. */
  private desired = new Set<number>();
  private readonly subscriptions = new Map<number, PartitionSubscription>();
  /** assign() and reconnects reconcile one at a time. */
  private reconciling: Promise<void> = Promise.resolve();

  constructor(
    private readonly options: AmqpLinkOptions,
    private readonly log: Logger,
    private readonly handlers: SourceHandlers,
  ) {}

  get connected(): boolean {
    return this.link?.alive === true;
  }

  get brokerState(): AmqpBrokerState {
    return {
      blocked: this.blocked !== null,
      blockedReason: this.blocked?.reason ?? null,
      blockedSince: this.blocked?.since.toISOString() ?? null,
      unroutableDeadLetters: this.unroutableDeadLetters,
    };
  }

  /** The node the daemon is connected to, redacted (for status and logs); null while it is not connected. */
  get node(): string | null {
    return this.connectedNode === null ? null : redactUrl(this.connectedNode);
  }

  get consuming(): boolean {
    if (!this.partitioned) return this.state === 'consuming' && this.link?.alive === true && this.consumerTag !== null;
    // Partitioned: connected, and subscribed to every partition it owns (none, for a daemon beyond N: a standby).
    if (this.state !== 'consuming' || this.link?.alive !== true) return false;
    for (const p of this.desired) if (this.subscriptions.get(p)?.consumerTag == null) return false;
    return true;
  }

  private get partitioned(): boolean {
    return (this.options.partitions ?? 1) > 1;
  }

  /** The partitions this daemon is subscribed to and not handing over, ascending (the heartbeat's `partitions`). */
  get partitionsHeld(): number[] {
    return [...this.subscriptions.entries()]
      .filter(([, sub]) => !sub.releasing && sub.link.alive)
      .map(([p]) => p)
      .sort((a, b) => a - b);
  }

  /**
   * The partitions this daemon owns now (partition-balancer.ts): subscribes
   * to the new ones, hands over the others. Single active consumer makes a
   * subscription to a partition another daemon still consumes wait until
   * that one lets go, so the order of the two daemons' moves does not matter.
   */
  assign(partitions: readonly number[]): void {
    if (!this.partitioned || this.state === 'stopping' || this.state === 'closed') return;
    this.desired = new Set(partitions);
    this.reconcile();
  }

  private reconcile(): void {
    this.reconciling = this.reconciling
      .then(() => this.reconcileOnce())
      .catch((error) => this.log.warn({ err: describeError(error) }, 'partition subscription failed; retrying at the next beat'));
  }

  private async reconcileOnce(): Promise<void> {
    const model = this.model;
    if (this.state !== 'consuming' || model === null) return;
    for (const [p, sub] of this.subscriptions) if (!this.desired.has(p) && !sub.releasing) void this.release(p, sub);
    for (const p of [...this.desired].sort((a, b) => a - b)) {
      if (this.subscriptions.has(p)) continue;
      if (this.state !== 'consuming' || this.model !== model) return;
      await this.subscribe(model, p);
    }
  }

  private async subscribe(model: ChannelModel, partition: number): Promise<void> {
    const queue = partitionQueue(this.options.queue, this.options.partitions ?? 1, partition);
    const channel = await model.createConfirmChannel();
    channel.on('error', (error: Error) => this.log.warn({ partition, err: describeError(error) }, 'amqp channel error'));
    await channel.prefetch(this.options.prefetch);
    const link: ChannelLink = { generation: ++this.generation, channel, alive: true, partition };
    const sub: PartitionSubscription = { link, consumerTag: null, releasing: false, lastDeliveryAt: performance.now() };
    this.subscriptions.set(partition, sub);
    channel.on('close', () => this.partitionDown(sub, sub.releasing ? PARTITION_RELEASED : 'channel closed'));
    channel.on('return', (message: Message) => this.deadLetterReturned(message));
    this.handlers.onLinkUp(link);
    const { consumerTag } = await channel.consume(
      queue,
      (message) => {
        if (message === null) {
          // The broker cancelled the consumer (queue deleted): close the channel; the next beat subscribes again.
          void channel.close().catch(() => {});
          return;
        }
        sub.lastDeliveryAt = performance.now();
        this.handlers.onDelivery(link, message);
      },
      { noAck: false },
    );
    sub.consumerTag = consumerTag;
    this.log.info({ partition, queue, generation: link.generation }, 'partition subscribed');
  }

  /**
   * Hands a partition over: cancel its consumer (no new deliveries; on a
   * quorum queue the next consumer is active from here), let what it holds
   * finish and be acked for up to handoffMs, then close its channel (on a
   * classic queue the next consumer is active from here; what is still
   * unacked goes back to the broker and to the next owner, whose markers or
   * claims recognise what this daemon counted meanwhile).
   */
  private async release(partition: number, sub: PartitionSubscription): Promise<void> {
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
    while (link.alive && (this.handlers.unackedOn?.(link) ?? 0) > 0 && performance.now() < until) await new Promise((resolve) => setTimeout(resolve, 50));
    const left = this.handlers.unackedOn?.(link) ?? 0;
    this.log.info({ partition, unackedLeft: left, generation: link.generation }, 'partition released');
    if (link.alive)
      await within(
        1_000,
        link.channel.close().catch(() => {}),
      );
    this.partitionDown(sub, PARTITION_RELEASED);
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
  async checkIdlePartitions(idleMs: number): Promise<void> {
    const model = this.model;
    if (!this.partitioned || this.state !== 'consuming' || model === null) return;
    const now = performance.now();
    for (const [partition, sub] of this.subscriptions) {
      if (sub.releasing || sub.consumerTag === null || !sub.link.alive || now - sub.lastDeliveryAt < idleMs) continue;
      if ((this.handlers.unackedOn?.(sub.link) ?? 0) > 0) continue;
      const queue = partitionQueue(this.options.queue, this.options.partitions ?? 1, partition);
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
      sub.releasing = true;
      await within(
        1_000,
        sub.link.channel.close().catch(() => {}),
      );
      this.partitionDown(sub, 'resubscribing an idle partition');
    }
  }

  private partitionDown(sub: PartitionSubscription, reason: string): void {
    const { link } = sub;
    if (!link.alive) return;
    link.alive = false;
    if (this.subscriptions.get(link.partition!) === sub) this.subscriptions.delete(link.partition!);
    this.handlers.onLinkDown(link, reason);
    // A channel lost while the connection lives (a channel error): subscribe again soon if it is still ours.
    if (reason !== PARTITION_RELEASED && this.state === 'consuming' && this.model !== null) setTimeout(() => this.reconcile(), 1_000).unref();
  }

  /** Connects (retrying transient failures) and starts consuming. */
  async start(): Promise<void> {
    this.state = 'connecting';
    await this.connectUntilUp();
  }

  /** What a refusal names: the nodes of one list share user, vhost and queues (broker-nodes.ts), so any node stands for all. */
  private target(node: string): BrokerTarget {
    return { url: node, queue: this.options.queue, deadLetterQueue: this.options.deadLetterQueue };
  }

  private async connectUntilUp(): Promise<void> {
    const { nodes } = this.options;
    let node = nodes[this.nodeIndex]!;
    try {
      // Ends without connecting when stop() moved the state on meanwhile.
      await retryUntilDone(
        async () => {
          node = nodes[this.nodeIndex]!;
          try {
            await this.connectOnce(node);
          } catch (error) {
            // The next attempt goes to the next node, after the usual backoff.
            this.nodeIndex = nextNodeIndex(this.nodeIndex, nodes.length);
            throw error;
          }
          this.everConnected = true;
        },
        {
          stopWhen: () => this.state !== 'connecting',
          // A refusal at start (login, permissions, an untrusted certificate) is configuration: one line naming the fix, not a retry loop.
          giveUp: (_failureClass, error) => !this.everConnected && classifyBrokerRefusal(error, this.target(node)) !== null,
          onAttemptFailed: ({ error, attempt, delayMs }) =>
            this.log.warn(
              { url: redactUrl(node), next: redactUrl(nodes[this.nodeIndex]!), attempt, delayMs, err: describeError(error) },
              'amqp connect failed; retrying',
            ),
        },
      );
    } catch (error) {
      const refusal = classifyBrokerRefusal(error, this.target(node));
      throw new TallyError(refusal?.code ?? 'TALLY_AMQP_REFUSED', `${refusal?.line ?? describeError(error)} (broker ${redactUrl(node)})`, { cause: error });
    }
  }

  private async connectOnce(node: string): Promise<void> {
    const model = await amqp.connect(node, { clientProperties: { connection_name: `tally-coordinator-${process.pid}` } });
    // From the first moment: a channel the broker closes re-emits its error on
    // the connection, and an 'error' without a listener is an uncaught throw.
    // A connection exception (503 COMMAND_INVALID for an exchange type the
    // broker lacks) closes the whole connection: the pending declare then
    // fails with amqplib's "Channel ended", which names nothing. The broker's
    // own close is the error to classify and report.
    let closedBy: Error | null = null;
    model.on('error', (error: Error) => {
      closedBy ??= error;
      this.log.warn({ err: describeError(error) }, 'amqp connection error');
    });
    this.watchAlarms(model);
    try {
      await this.declareQueues(model);
      const channel = await model.createConfirmChannel();
      channel.on('error', (error: Error) => this.log.warn({ err: describeError(error) }, 'amqp channel error'));
      await channel.prefetch(this.options.prefetch);
      const link: ChannelLink = { generation: ++this.generation, channel, alive: true };
      const down = (reason: string) => this.linkDown(link, reason);
      model.on('close', (error?: Error) => down(error ? describeError(error) : 'connection closed'));
      channel.on('close', () => down('channel closed'));
      channel.on('return', (message: Message) => this.deadLetterReturned(message));
      this.model = model;
      this.link = link;
      this.connectedNode = node;
      if (this.partitioned) {
        // The first channel consumes nothing here: each partition gets a channel of its own (assign()).
        this.consumerTag = null;
        this.state = 'consuming';
        this.log.info(
          {
            url: redactUrl(node),
            node: `${this.nodeIndex + 1} of ${this.options.nodes.length}`,
            exchange: this.options.queue,
            partitions: this.options.partitions,
          },
          'consuming',
        );
        this.reconcile();
        return;
      }
      this.handlers.onLinkUp(link);
      const { consumerTag } = await channel.consume(
        this.options.queue,
        (message) => {
          if (message === null) {
            // The broker cancelled us (queue deleted): treat it as a lost link.
            down('consumer cancelled by the broker');
            return;
          }
          this.handlers.onDelivery(link, message);
        },
        { noAck: false },
      );
      this.consumerTag = consumerTag;
      this.state = 'consuming';
      this.log.info(
        {
          url: redactUrl(node),
          node: `${this.nodeIndex + 1} of ${this.options.nodes.length}`,
          queue: this.options.queue,
          prefetch: this.options.prefetch,
          generation: link.generation,
        },
        'consuming',
      );
    } catch (error) {
      await model.close().catch(() => {});
      throw amqpReplyCode(error) === null && closedBy !== null ? closedBy : error;
    }
  }

  /**
   * Declares the work queue and `<queue>.dead` as durable queues of
   * TALLY_QUEUE_TYPE; a queue that exists with other arguments (declared by
   * an operator: another type, TTLs) is used as it is instead of failing
   * with PRECONDITION_FAILED, and what was found is logged.
   */
  private async declareQueues(model: ChannelModel): Promise<void> {
    const { queue, deadLetterQueue, queueType = 'classic', deliveryLimit = 20, partitions = 1 } = this.options;
    await declareTallyQueues(model, { queue, deadLetterQueue, queueType, deliveryLimit, partitions }, this.log);
  }

  /**
   * Memory and disk alarms: RabbitMQ stops reading from a connection that
   * publishes, so dead-letter copies wait (their originals stay unacked).
   * Consuming and acking go on. Logged, and shown in status and /readyz.
   */
  private watchAlarms(model: ChannelModel): void {
    this.blocked = null;
    model.on('blocked', (reason: string) => {
      this.blocked = { reason: String(reason), since: new Date() };
      this.log.warn({ reason: String(reason) }, 'amqp connection blocked by the broker (resource alarm): dead-letter publishes wait until it clears');
    });
    model.on('unblocked', () => {
      const since = this.blocked?.since;
      this.blocked = null;
      this.log.info({ blockedMs: since ? Date.now() - since.getTime() : null }, 'amqp connection unblocked');
    });
  }

  private deadLetterReturned(message: Message): void {
    const id = message.properties.headers?.[DEAD_LETTER_ID_HEADER];
    this.unroutableDeadLetters++;
    const fields = message.fields as Message['fields'] & { replyCode?: number; replyText?: string };
    this.log.warn(
      { queue: this.options.deadLetterQueue, replyCode: fields.replyCode, replyText: fields.replyText, messageId: message.properties.messageId },
      `dead-letter copy unroutable: queue ${this.options.deadLetterQueue} is missing; its original stays unacked and is retried`,
    );
    if (typeof id === 'string') this.returnedDeadLetters.add(id);
  }

  private linkDown(link: ChannelLink, reason: string): void {
    if (!link.alive) return;
    link.alive = false;
    const lost = this.link === link ? this.connectedNode : null;
    if (this.link === link) {
      this.consumerTag = null;
      this.connectedNode = null;
      // The connection is gone with every partition channel on it: their deliveries go back to the broker.
      for (const sub of [...this.subscriptions.values()]) this.partitionDown(sub, reason);
    }
    if (!this.partitioned) this.handlers.onLinkDown(link, reason);
    if (this.state === 'consuming' && this.link === link) {
      // The node may be gone for good: the reconnect starts at the next one (the same one when there is only one).
      this.nodeIndex = nextNodeIndex(this.nodeIndex, this.options.nodes.length);
      this.log.warn(
        { reason, generation: link.generation, url: lost === null ? null : redactUrl(lost), next: redactUrl(this.options.nodes[this.nodeIndex]!) },
        'amqp link lost; reconnecting',
      );
      this.state = 'connecting';
      const model = this.model;
      this.model = null;
      void model?.close().catch(() => {});
      void this.connectUntilUp().catch((error) => {
        this.log.fatal({ err: describeError(error) }, 'amqp reconnect gave up');
        process.exitCode = 1;
      });
    }
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

  /**
   * Publishes a copy of a bad message to `<queue>.dead`, body untouched,
   * reason in `x-tally-reason`, and resolves once the broker confirmed it.
   * Only then may the original be acked: nothing is lost, nothing requeued.
   */
  deadLetter(link: ChannelLink, message: ConsumeMessage, reason: string): Promise<void> {
    const channel = link.channel as ConfirmChannel;
    const { properties } = message;
    const id = randomUUID();
    const options = copyPublishOptions(properties, {
      ...(properties.headers ?? {}),
      'x-tally-reason': reason,
      // The first attempt's time, right after the batch that marked what was counted of it (replay-guard.ts).
      [DEAD_AT_HEADER]: this.firstDeadLetterAttempt(message),
      // The partition queue it came from: a replay must return it there (dead-queue.ts), where its markers' copies go.
      'x-tally-source-queue':
        link.partition === undefined ? this.options.queue : partitionQueue(this.options.queue, this.options.partitions ?? 1, link.partition),
      [DEAD_LETTER_ID_HEADER]: id,
    });
    return new Promise((resolve, reject) => {
      if (!link.alive) {
        reject(new Error('link down'));
        return;
      }
      try {
        channel.sendToQueue(this.options.deadLetterQueue, message.content, options, (error) => {
          const returned = this.returnedDeadLetters.delete(id);
          if (error) reject(error instanceof Error ? error : new Error(String(error)));
          else if (returned) reject(new UnroutableDeadLetterError(this.options.deadLetterQueue, 'NO_ROUTE'));
          else resolve();
        });
      } catch (error) {
        reject(error);
      }
    });
  }

  /** When the first publish of a message's dead-letter copy was attempted (a retry keeps it). */
  private firstDeadLetterAttempt(message: ConsumeMessage): number {
    let at = this.deadLetterAttempts.get(message);
    if (at === undefined) {
      at = Date.now();
      this.deadLetterAttempts.set(message, at);
    }
    return at;
  }

  /** Stops new deliveries; what is in flight stays acknowledgeable. Waits at most `timeoutMs` for the broker's cancel-ok. */
  async stopConsuming(timeoutMs = 1_000): Promise<void> {
    this.state = 'stopping';
    const link = this.link;
    const tag = this.consumerTag;
    this.consumerTag = null;
    // Partitions: every consumer cancelled, channels kept open so what is in flight can still be acked.
    const partitionCancels = [...this.subscriptions.values()].map(async (sub) => {
      const partitionTag = sub.consumerTag;
      sub.consumerTag = null;
      if (sub.link.alive && partitionTag !== null) await sub.link.channel.cancel(partitionTag).catch(() => {});
    });
    if (partitionCancels.length > 0 && (await within(timeoutMs, Promise.all(partitionCancels))) === TIMED_OUT) {
      this.log.warn({ timeoutMs }, 'the broker did not confirm the partition cancels in time; going on with the stop');
    }
    if (link?.alive && tag) {
      const cancelled = await within(
        timeoutMs,
        link.channel.cancel(tag).catch((error) => this.log.warn({ err: describeError(error) }, 'cancel failed')),
      );
      if (cancelled === TIMED_OUT) this.log.warn({ timeoutMs }, 'the broker did not confirm the cancel in time; going on with the stop');
    }
  }

  /** Whether close() was called: a channel closing after it is the stop, not a loss. */
  get closing(): boolean {
    return this.state === 'closed';
  }

  /**
   * Closes the channel, then the connection, each waiting at most
   * `timeoutMs` for the broker; a broker that does not answer gets its
   * socket destroyed. Unacked deliveries are requeued by the broker either way.
   */
  async close(timeoutMs = 1_000): Promise<void> {
    if (this.state === 'closed') return;
    this.state = 'closed';
    const link = this.link;
    const model = this.model;
    this.model = null;
    const started = performance.now();
    const left = () => Math.max(0, timeoutMs - (performance.now() - started));
    const partitionCloses = [...this.subscriptions.values()].filter((sub) => sub.link.alive).map((sub) => sub.link.channel.close().catch(() => {}));
    if (partitionCloses.length > 0 && (await within(left(), Promise.all(partitionCloses))) === TIMED_OUT) {
      this.log.warn({ timeoutMs }, 'the broker did not confirm the partition channel closes in time');
    }
    if (link?.alive) {
      const closed = await within(
        left(),
        link.channel.close().catch((error: unknown) => this.log.warn({ err: describeError(error) }, 'closing the amqp channel failed')),
      );
      if (closed === TIMED_OUT) this.log.warn({ timeoutMs }, 'the broker did not confirm the channel close in time');
    }
    if (model === null) return;
    const closed = await within(
      left(),
      model.close().catch((error: unknown) => this.log.debug({ err: describeError(error) }, 'closing the amqp connection failed')),
    );
    if (closed === TIMED_OUT) {
      this.log.warn({ timeoutMs }, 'the broker did not confirm the connection close in time; dropping the socket');
      (model.connection as unknown as { stream?: { destroy(): void } }).stream?.destroy();
    }
  }
}
