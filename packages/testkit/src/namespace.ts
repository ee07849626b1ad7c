import amqp from 'amqplib';
import { Redis } from 'ioredis';

export interface Namespace {
  readonly amqpUrl: string;
  readonly redisUrl: string;
  readonly queue: string;
  readonly prefix: string;
}

/**
 * Deletes a queue, its dead-letter queue and every Redis key under a prefix:
 * a clean slate for a demo or a benchmark round. Never used by the daemon.
 */
export async function resetNamespace(space: Namespace): Promise<void> {
  const connection = await amqp.connect(space.amqpUrl);
  try {
    const channel = await connection.createChannel();
    await channel.deleteQueue(space.queue);
    await channel.deleteQueue(`${space.queue}.dead`);
    await channel.close();
  } finally {
    await connection.close().catch(() => {});
  }
  const redis = new Redis(space.redisUrl);
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${space.prefix.replace(/[*?[\]\\]/g, '\\$&')}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await redis.unlink(...keys);
    } while (cursor !== '0');
  } finally {
    redis.disconnect();
  }
}
