/**
 * Publishes a workload: persistent messages with publisher confirms, to the queue, the partitions' exchange
 * or a stream.
 */
import amqp from 'amqplib';
import type { Publish } from './workload.js';

export interface PublishOptions {
  readonly url: string;
  readonly queue: string;
  /**
   * TALLY_PARTITIONS: above 1, publish to the consistent-hash exchange named
   * `queue` with the message id as the routing key (partitionedTarget).
   */
  readonly partitions?: number;
  /** TALLY_SOURCE=stream with one partition: a missing TALLY_QUEUE is declared as a stream, not a classic queue. */
  readonly stream?: boolean;
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
    const target = await publishTarget(connection, channel, options.queue, options.partitions ?? 1, options.stream ?? false);
    const every = options.confirmEvery ?? 2_000;
    let published = 0;
    for (const publish of publishes) {
      const ok = target.send(publish, {
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
    target.check();
    await channel.close();
    return published;
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Declares a durable queue (a stream with `stream`) unless it exists already (possibly with other arguments). */
export async function ensureQueue(connection: amqp.ChannelModel, queue: string, stream = false): Promise<void> {
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
  await channel.assertQueue(queue, { durable: true, ...(stream ? { arguments: { 'x-queue-type': 'stream' } } : {}) });
  await channel.close();
}

/**
 * The routing key of a message on a partitioned deployment: its id (the
 * body's `id`, else the `messageId` property), so every copy of an id hashes
 * to the same partition. A message without either gets the empty key: the
 * consistent-hash exchange hashes it like any other key, so all of them land
 * on one partition (they carry no id, so Tally dead-letters them anyway).
 */
export function routingKeyOf(publish: Pick<Publish, 'id' | 'messageId'>): string {
  return publish.id ?? publish.messageId ?? '';
}

export interface PublishTarget {
  send(publish: Publish, options: amqp.Options.Publish): boolean;
  /** Throws when the broker returned a message as unroutable (mandatory publish). */
  check(): void;
}

/**
 * Where messages go: the queue itself with one partition (declared when
 * missing, as before); the exchange `queue` with several, which must exist
 * (the daemon declares it with its queues). Those publishes are mandatory:
 * an exchange without bound queues would drop them silently, so a return is
 * an error here instead.
 */
export async function publishTarget(
  connection: amqp.ChannelModel,
  channel: amqp.ConfirmChannel,
  queue: string,
  partitions: number,
  stream = false,
): Promise<PublishTarget> {
  if (partitions <= 1) {
    await ensureQueue(connection, queue, stream);
    return { send: (publish, options) => channel.sendToQueue(queue, publish.body, options), check: () => {} };
  }
  const probe = await connection.createChannel();
  probe.on('error', () => {});
  try {
    await probe.checkExchange(queue);
  } catch (error) {
    throw new Error(
      `exchange ${queue} does not exist: start a Tally daemon with TALLY_PARTITIONS=${partitions} first (it declares the exchange and its queues)`,
      {
        cause: error,
      },
    );
  }
  await probe.close().catch(() => {});
  let returned = 0;
  channel.on('return', () => returned++);
  return {
    send: (publish, options) => channel.publish(queue, routingKeyOf(publish), publish.body, { ...options, mandatory: true }),
    check: () => {
      if (returned > 0) throw new Error(`${returned} messages returned unroutable by exchange ${queue}: it has no bound partition queue`);
    },
  };
}
