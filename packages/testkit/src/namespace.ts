/**
 * Deletes a queue with its dead letters and partitions, and a prefix's keys: a clean slate for a test,
 * the demo or a bench round, on a standalone Redis or a cluster.
 */
import amqp from 'amqplib';
import { Cluster, Redis } from 'ioredis';

export interface Namespace {
  readonly amqpUrl: string;
  /** One URL, or a Redis Cluster's seed nodes separated by commas (as TALLY_REDIS_URL). */
  readonly redisUrl: string;
  readonly queue: string;
  readonly prefix: string;
  /** TALLY_PARTITIONS: above 1, the partition queues `<queue>.<p>` and the exchange `<queue>` go too. */
  readonly partitions?: number;
}

/**
 * Deletes a queue, its dead-letter queue and every Redis key under a prefix:
 * a clean slate for a demo or a benchmark round. Never used by the daemon.
 * On a Redis Cluster every master is scanned, and keys are unlinked one by
 * one (a multi-key UNLINK must stay within one slot).
 */
export async function resetNamespace(space: Namespace): Promise<void> {
  const connection = await amqp.connect(space.amqpUrl);
  try {
    const channel = await connection.createChannel();
    await channel.deleteQueue(space.queue);
    await channel.deleteQueue(`${space.queue}.dead`);
    for (let p = 0; p < (space.partitions ?? 1) && (space.partitions ?? 1) > 1; p++) await channel.deleteQueue(`${space.queue}.${p}`);
    if ((space.partitions ?? 1) > 1) await channel.deleteExchange(space.queue);
    await channel.close();
  } finally {
    await connection.close().catch(() => {});
  }
  await deleteKeys(space.redisUrl, space.prefix);
}

/** Every key under `prefix`, on a standalone Redis or on every master of a cluster. */
export async function deleteKeys(redisUrl: string, prefix: string): Promise<void> {
  const seeds = redisUrl.split(/,\s*(?=rediss?:\/\/)/i);
  const first = new Redis(seeds[0]!, { maxRetriesPerRequest: 1 });
  let cluster: Cluster | null = null;
  try {
    const clustered = /^cluster_enabled:1\s*$/m.test(await first.info('cluster'));
    const pattern = `${prefix.replace(/[*?[\]\\]/g, '\\$&')}*`;
    if (!clustered) {
      await unlinkMatching(first, pattern, true);
      return;
    }
    cluster = new Cluster(
      seeds.map((seed) => {
        const url = new URL(seed);
        return { host: url.hostname, port: Number(url.port || 6379) };
      }),
      { redisOptions: { password: first.options.password, username: first.options.username } },
    );
    await new Promise<void>((resolve, reject) => {
      cluster!.once('ready', resolve);
      cluster!.once('error', reject);
    });
    for (const master of cluster.nodes('master')) await unlinkMatching(master, pattern, false);
  } finally {
    first.disconnect();
    cluster?.disconnect();
  }
}

async function unlinkMatching(redis: Redis, pattern: string, multiKey: boolean): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    if (keys.length === 0) continue;
    if (multiKey) await redis.unlink(...keys);
    else {
      const pipeline = redis.pipeline();
      for (const key of keys) pipeline.unlink(key);
      await pipeline.exec();
    }
  } while (cursor !== '0');
}
