/**
 * Dead-lettering (invariants 5, 6 and 11): a copy of the delivery goes to
 * `<queue>.dead` with its reason, and only once the broker confirmed the
 * copy is the original acked. An unconfirmed publish is retried until the
 * channel it belongs to dies; then the original is redelivered on the next
 * one and goes through this again.
 */
import type { Tracer } from '@opentelemetry/api';
import type { ConsumeMessage } from 'amqplib';
import { describeError, retryUntilDone, RETRY_STOPPED, type BackoffOptions } from '@tally/shared';
import { BadMessageLog } from './bad-message-log.js';
import type { ChannelLink } from './delivery.js';
import type { Logger } from '../process/logger.js';
import { recordDeadLetter } from '../telemetry/batch-span.js';
import type { AckWindow } from './ack-window.js';
import type { Counters, DeadLetterPublisher } from './ports.js';

export interface DeadLetterDeps {
  readonly publisher: DeadLetterPublisher;
  readonly counters: Counters;
  readonly acks: AckWindow;
  readonly tracer: Tracer;
  readonly log: Logger;
}

export class DeadLetters {
  /** Publishes not yet confirmed (or given up with their channel): a drain waits for them. */
  private readonly pending = new Set<Promise<void>>();
  private readonly badLog: BadMessageLog;
  private readonly publisher: DeadLetterPublisher;
  private readonly counters: Counters;
  private readonly acks: AckWindow;
  private readonly tracer: Tracer;
  private readonly log: Logger;

  constructor(
    deps: DeadLetterDeps,
    /** The queue the dead letters come from, for their spans. */
    private readonly queue: string,
    /** The retries' backoff; the shared default when absent (tests shorten it). */
    private readonly backoff?: BackoffOptions,
  ) {
    ({ publisher: this.publisher, counters: this.counters, acks: this.acks, tracer: this.tracer, log: this.log } = deps);
    this.badLog = new BadMessageLog(this.log);
  }

  /** Sends `message` to the dead-letter queue with `reason` (its code first, e.g. `count-refused: …`) and `headers` added, then acks it. */
  send(channel: ChannelLink, message: ConsumeMessage, code: string, reason: string, traceparent: unknown, headers?: Record<string, unknown>): void {
    recordDeadLetter(this.tracer, this.queue, code, traceparent);
    this.badLog.record(code, reason, message.properties.messageId);
    const published = retryUntilDone(() => this.publisher.deadLetter(channel, message, reason, headers), {
      // Given up when the channel dies: the original is redelivered on the next one.
      stopWhen: () => !channel.alive,
      onAttemptFailed: ({ error, delayMs }) => this.log.warn({ err: describeError(error), delayMs }, 'dead-letter publish not confirmed; retrying'),
      ...(this.backoff === undefined ? {} : { backoff: this.backoff }),
    });
    const pending = published.then((outcome) => {
      if (outcome === RETRY_STOPPED) return;
      this.counters.add('dead_lettered');
      this.acks.finish(channel, message.fields.deliveryTag);
    });
    this.pending.add(pending);
    void pending.finally(() => this.pending.delete(pending));
  }

  /** Publishes not yet settled. */
  get unsettled(): number {
    return this.pending.size;
  }

  /** Resolves once every publish sent so far is confirmed or given up. */
  async whenSettled(): Promise<void> {
    await Promise.all(this.pending);
  }
}
