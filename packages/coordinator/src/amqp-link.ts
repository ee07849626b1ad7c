/**
 * The RabbitMQ edge: one connection, one confirm channel used both to consume
 * and to publish dead letters, reconnected with backoff when it goes away.
 *
 * Every (re)connection is a new ChannelLink with a new generation. Delivery
 * tags are per channel, so a delivery is only ever acked on the link it came
 * from; when a link dies its unacked deliveries are simply redelivered by the
 * broker, and the markers (or the in-flight id hold) recognise them.
 */
import amqp, { type ChannelModel, type ConfirmChannel, type ConsumeMessage, type Message, type Options } from 'amqplib';
import { describeError, redactUrl, retryUntilDone, TallyError } from '@tally/shared';
import { isAmqpRefusal } from './amqp-refusal.js';
import type { ChannelLink } from './delivery.js';
import type { Logger } from './logger.js';

export interface AmqpLinkOptions {
  readonly url: string;
  readonly queue: string;
  readonly deadLetterQueue: string;
  readonly prefetch: number;
}

export interface AmqpLinkHandlers {
  onDelivery(link: ChannelLink, message: ConsumeMessage): void;
  onLinkUp(link: ChannelLink): void;
  onLinkDown(link: ChannelLink, reason: string): void;
}

type LinkState = 'idle' | 'connecting' | 'consuming' | 'stopping' | 'closed';

export class AmqpLink {
  private state: LinkState = 'idle';
  private model: ChannelModel | null = null;
  private link: ChannelLink | null = null;
  private consumerTag: string | null = null;
  private generation = 0;
  private everConnected = false;

  constructor(
    private readonly options: AmqpLinkOptions,
    private readonly log: Logger,
    private readonly handlers: AmqpLinkHandlers,
  ) {}

  get current(): ChannelLink | null {
    return this.link?.alive ? this.link : null;
  }

  get consuming(): boolean {
    return this.state === 'consuming' && this.link?.alive === true && this.consumerTag !== null;
  }

  /** Connects (retrying transient failures) and starts consuming. */
  async start(): Promise<void> {
    this.state = 'connecting';
    await this.connectUntilUp();
  }

  private async connectUntilUp(): Promise<void> {
    try {
      // Ends without connecting when stop() moved the state on meanwhile.
      await retryUntilDone(
        async () => {
          await this.connectOnce();
          this.everConnected = true;
        },
        {
          stopWhen: () => this.state !== 'connecting',
          giveUp: (_failureClass, error) => !this.everConnected && isAmqpRefusal(error),
          onAttemptFailed: ({ error, attempt, delayMs }) =>
            this.log.warn({ url: redactUrl(this.options.url), attempt, delayMs, err: describeError(error) }, 'amqp connect failed; retrying'),
        },
      );
    } catch (error) {
      throw new TallyError('TALLY_AMQP_UNAVAILABLE', `RabbitMQ at ${redactUrl(this.options.url)} refused Tally: ${describeError(error)}`, { cause: error });
    }
  }

  private async connectOnce(): Promise<void> {
    const model = await amqp.connect(this.options.url, { clientProperties: { connection_name: `tally-coordinator-${process.pid}` } });
    try {
      await this.declareQueues(model);
      const channel = await model.createConfirmChannel();
      await channel.prefetch(this.options.prefetch);
      const link: ChannelLink = { generation: ++this.generation, channel, alive: true };
      const down = (reason: string) => this.linkDown(link, reason);
      model.on('error', (error: Error) => this.log.warn({ err: describeError(error) }, 'amqp connection error'));
      model.on('close', (error?: Error) => down(error ? describeError(error) : 'connection closed'));
      channel.on('error', (error: Error) => this.log.warn({ err: describeError(error) }, 'amqp channel error'));
      channel.on('close', () => down('channel closed'));
      this.model = model;
      this.link = link;
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
      this.log.info({ url: redactUrl(this.options.url), queue: this.options.queue, prefetch: this.options.prefetch, generation: link.generation }, 'consuming');
    } catch (error) {
      await model.close().catch(() => {});
      throw error;
    }
  }

  /**
   * Declares the work queue and `<queue>.dead` as durable queues, unless they
   * already exist: a queue an operator declared with other arguments (quorum,
   * TTLs) is used as it is instead of failing with PRECONDITION_FAILED.
   */
  private async declareQueues(model: ChannelModel): Promise<void> {
    for (const queue of [this.options.queue, this.options.deadLetterQueue]) {
      const probe = await model.createChannel();
      probe.on('error', () => {});
      try {
        await probe.checkQueue(queue);
        await probe.close();
        continue;
      } catch {
        // NOT_FOUND closed the probe channel; declare it on a fresh one.
      }
      const channel = await model.createChannel();
      await channel.assertQueue(queue, { durable: true });
      await channel.close();
    }
  }

  private linkDown(link: ChannelLink, reason: string): void {
    if (!link.alive) return;
    link.alive = false;
    if (this.link === link) this.consumerTag = null;
    this.handlers.onLinkDown(link, reason);
    if (this.state === 'consuming' && this.link === link) {
      this.log.warn({ reason, generation: link.generation }, 'amqp link lost; reconnecting');
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

  /** Acks every delivery up to `tag` on `link`; a dead link's deliveries are left to redelivery. */
  ack(link: ChannelLink, tag: number): boolean {
    if (!link.alive) return false;
    try {
      link.channel.ack({ fields: { deliveryTag: tag } } as Message, true);
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
    const options: Options.Publish = {
      persistent: true,
      headers: { ...(properties.headers ?? {}), 'x-tally-reason': reason, 'x-tally-source-queue': this.options.queue },
      contentType: properties.contentType,
      contentEncoding: properties.contentEncoding,
      messageId: properties.messageId,
      correlationId: properties.correlationId,
      timestamp: properties.timestamp,
      type: properties.type,
      appId: properties.appId,
    };
    return new Promise((resolve, reject) => {
      if (!link.alive) {
        reject(new Error('link down'));
        return;
      }
      try {
        channel.sendToQueue(this.options.deadLetterQueue, message.content, options, (error) => {
          if (error) reject(error instanceof Error ? error : new Error(String(error)));
          else resolve();
        });
      } catch (error) {
        reject(error);
      }
    });
  }

  /** Stops new deliveries; what is in flight stays acknowledgeable. */
  async stopConsuming(): Promise<void> {
    this.state = 'stopping';
    const link = this.link;
    const tag = this.consumerTag;
    this.consumerTag = null;
    if (link?.alive && tag) {
      await link.channel.cancel(tag).catch((error) => this.log.warn({ err: describeError(error) }, 'cancel failed'));
    }
  }

  async close(): Promise<void> {
    if (this.state === 'closed') return;
    this.state = 'closed';
    const link = this.link;
    if (link?.alive) {
      try {
        await link.channel.close();
      } catch (error) {
        this.log.warn({ err: describeError(error) }, 'closing the amqp channel failed');
      }
    }
    try {
      await this.model?.close();
    } catch (error) {
      this.log.debug({ err: describeError(error) }, 'closing the amqp connection failed');
    }
    this.model = null;
  }
}
