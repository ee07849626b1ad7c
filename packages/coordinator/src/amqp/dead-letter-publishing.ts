/**
 * Dead-letter copies, published on the confirm channel the original came on:
 * body untouched, reason in `x-tally-reason`, resolved only once the broker
 * confirmed the copy, so the original is acked only then (nothing lost,
 * nothing requeued forever). A copy the broker returns unroutable (its
 * queue was deleted) rejects: its original stays unacked and is retried.
 */
import { randomUUID } from 'node:crypto';
import type { Channel, ConfirmChannel, ConsumeMessage, Message } from 'amqplib';
import { DEAD_AT_HEADER, STANDING_COUNTS_HEADER } from '@tally/shared';
import type { ChannelLink } from '../pipeline/delivery.js';
import type { Logger } from '../process/logger.js';
import { copyPublishOptions } from './message-copy.js';

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

export class DeadLetterPublishing {
  /** Ids of dead-letter copies the broker returned and whose confirm has not come yet. */
  private readonly returned = new Set<string>();
  /** The first dead-letter attempt's time per message (x-tally-dead-at); gone with the message. */
  private readonly firstAttempts = new WeakMap<ConsumeMessage, number>();

  constructor(
    private readonly deadLetterQueue: string,
    private readonly log: Logger,
    /** Told of each copy returned unroutable (the gauge). */
    private readonly onUnroutable: () => void,
  ) {}

  /** Listens for returned copies on a channel that will publish them: call once per channel. */
  watch(channel: Channel): void {
    channel.on('return', (message: Message) => this.returnedCopy(message));
  }

  /**
   * Publishes the copy on `link`'s channel; `sourceQueue` is the queue or
   * stream the original came from, which a replay returns it to (dead-queue.ts).
   */
  publish(link: ChannelLink, message: ConsumeMessage, reason: string, sourceQueue: string, extraHeaders: Record<string, unknown> = {}): Promise<void> {
    const channel = link.channel as ConfirmChannel;
    const { properties } = message;
    const id = randomUUID();
    // Standing counts are the daemon's word alone (replay-guard.ts): a producer's or an earlier dead letter's copy of the header goes.
    const { [STANDING_COUNTS_HEADER]: _theirs, ...headers } = properties.headers ?? {};
    const options = copyPublishOptions(properties, {
      ...headers,
      ...extraHeaders,
      'x-tally-reason': reason,
      // The first attempt's time, right after the batch that marked what was counted of it (replay-guard.ts). A
      // replayed copy's x-tally-first-dead-at (an earlier dead-lettering) stays among the headers above.
      [DEAD_AT_HEADER]: this.firstAttempt(message),
      'x-tally-source-queue': sourceQueue,
      [DEAD_LETTER_ID_HEADER]: id,
    });
    return new Promise((resolve, reject) => {
      if (!link.alive) {
        reject(new Error('link down'));
        return;
      }
      try {
        channel.sendToQueue(this.deadLetterQueue, message.content, options, (error) => {
          const returned = this.returned.delete(id);
          if (error) reject(error instanceof Error ? error : new Error(String(error)));
          else if (returned) reject(new UnroutableDeadLetterError(this.deadLetterQueue, 'NO_ROUTE'));
          else resolve();
        });
      } catch (error) {
        reject(error);
      }
    });
  }

  private returnedCopy(message: Message): void {
    const id = message.properties.headers?.[DEAD_LETTER_ID_HEADER];
    this.onUnroutable();
    const fields = message.fields as Message['fields'] & { replyCode?: number; replyText?: string };
    this.log.warn(
      { queue: this.deadLetterQueue, replyCode: fields.replyCode, replyText: fields.replyText, messageId: message.properties.messageId },
      `dead-letter copy unroutable: queue ${this.deadLetterQueue} is missing; its original stays unacked and is retried`,
    );
    if (typeof id === 'string') this.returned.add(id);
  }

  /** When the first publish of a message's dead-letter copy was attempted (a retry keeps it). */
  private firstAttempt(message: ConsumeMessage): number {
    let at = this.firstAttempts.get(message);
    if (at === undefined) {
      at = Date.now();
      this.firstAttempts.set(message, at);
    }
    return at;
  }
}
