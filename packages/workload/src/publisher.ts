import amqp from 'amqplib';
import type { Publish } from './workload.js';

export interface PublishOptions {
  readonly url: string;
  readonly queue: string;
  /** Wait for broker confirms every this many messages. */
  readonly confirmEvery?: number;
  readonly onProgress?: (published: number) => void;
  /** amqplib socket options, such as `{ ca }` for a broker whose certificate a private CA signed. */
  readonly socket?: Readonly<Record<string, unknown>>;
}

/**
 * Publishes persistent messages with publisher confirms, so that when this
 * resolves the broker holds every one of them.
 */
export async function publishAll(publishes: readonly Publish[], options: PublishOptions): Promise<number> {
  const connection = await amqp.connect(options.url, { ...options.socket, clientProperties: { connection_name: 'tally-publisher' } });
  try {
    const channel = await connection.createConfirmChannel();
    await ensureQueue(connection, options.queue);
    const every = options.confirmEvery ?? 2_000;
    let published = 0;
    for (const publish of publishes) {
      const ok = channel.sendToQueue(options.queue, publish.body, {
        persistent: true,
        contentType: 'application/json',
        timestamp: Date.now(),
        ...(publish.messageId !== undefined ? { messageId: publish.messageId } : {}),
        ...(publish.headers !== undefined ? { headers: publish.headers } : {}),
      });
      published++;
      if (!ok || published % every === 0) {
        await channel.waitForConfirms();
        options.onProgress?.(published);
      }
    }
    await channel.waitForConfirms();
    await channel.close();
    return published;
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Declares a durable queue unless it exists already (possibly with other arguments). */
export async function ensureQueue(connection: amqp.ChannelModel, queue: string): Promise<void> {
  const probe = await connection.createChannel();
  probe.on('error', () => {});
  try {
    await probe.checkQueue(queue);
    await probe.close();
    return;
  } catch {
    // NOT_FOUND closed the probe.
  }
  const channel = await connection.createChannel();
  await channel.assertQueue(queue, { durable: true });
  await channel.close();
}
