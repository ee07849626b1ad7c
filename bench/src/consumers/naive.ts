#!/usr/bin/env node
/**
 * The naive contender: the idempotent consumer as most people write it,
 * correctly. Per message, in delivery order, one at a time:
 *
 *   EXISTS marker  -> if set: ack, a duplicate
 *   pipeline INCRBY + EXPIRE per change
 *   SET marker 1 EX 600
 *   ack
 *
 * One at a time is what makes it correct: handling deliveries concurrently
 * would let two copies of one id both pass the EXISTS check. Count keys use
 * Tally's layout so the bench verifies both the same way; the marker is per
 * message (`<prefix>m:<id>`), as such a consumer has no shards.
 */
import amqp, { type ConsumeMessage } from 'amqplib';
import { Redis } from 'ioredis';
import { countKey, shardOf } from '@tally/shared';
import { onTerminate, readSettings, report, warmupReporter } from './protocol.js';

const settings = readSettings(process.env);
const warmed = warmupReporter(settings.warmup);
const prefix = settings.prefix ?? 'bench:naive:';
const markerTtlS = settings.markerTtlS ?? 600;
const countTtlS = settings.countTtlS ?? 2_592_000;
const virtualShards = settings.virtualShards ?? 16;
const redis = new Redis(settings.redisUrl ?? 'redis://127.0.0.1:6379', { connectionName: 'tally-bench-naive' });
const connection = await amqp.connect(settings.amqpUrl, { clientProperties: { connection_name: 'tally-bench-naive' } });
const channel = await connection.createChannel();
await channel.prefetch(settings.prefetch);

interface Body {
  id?: unknown;
  changes?: Array<{ sku: string; delta: number }>;
}

let acked = 0;
let duplicates = 0;
const samples: Array<[number, number]> = [];
const backlog: ConsumeMessage[] = [];
let head = 0;
let running = false;

async function handle(message: ConsumeMessage): Promise<void> {
  const body = JSON.parse(message.content.toString('utf8')) as Body;
  const id = typeof body.id === 'string' ? body.id : message.properties.messageId;
  if (typeof id === 'string') {
    const marker = `${prefix}m:${id}`;
    if ((await redis.exists(marker)) === 1) {
      duplicates++;
    } else {
      const pipeline = redis.pipeline();
      for (const { sku, delta } of body.changes ?? []) {
        if (delta === 0) continue;
        const key = countKey(prefix, shardOf(sku, virtualShards), sku);
        pipeline.incrby(key, delta);
        pipeline.expire(key, countTtlS);
      }
      const results = await pipeline.exec();
      for (const [error] of results ?? []) if (error) throw error;
      await redis.set(marker, '1', 'EX', markerTtlS);
    }
  }
  channel.ack(message);
  acked++;
  warmed(acked);
  if (settings.recordLatency) {
    const stamp = Number(message.properties.timestamp);
    samples.push([stamp, Date.now() - stamp]);
  }
  if (acked === settings.expected) report({ event: 'done', at: Date.now(), acked, duplicates, ...(settings.recordLatency ? { samples } : {}) });
}

async function drainBacklog(): Promise<void> {
  running = true;
  try {
    while (head < backlog.length) {
      const message = backlog[head++]!;
      if (head > 4096) {
        backlog.splice(0, head);
        head = 0;
      }
      await handle(message);
    }
  } catch (error) {
    report({ event: 'error', message: error instanceof Error ? error.message : String(error) });
    process.exit(1);
  } finally {
    running = false;
  }
}

await channel.consume(settings.queue, (message) => {
  if (message === null) return;
  backlog.push(message);
  if (!running) void drainBacklog();
});
report({ event: 'consuming', at: Date.now() });

onTerminate(async () => {
  await connection.close().catch(() => {});
  redis.disconnect();
});
