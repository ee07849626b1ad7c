#!/usr/bin/env node
/**
 * The batched contender: what a careful user would hand-write instead of
 * Tally. One process, no threads, batches of up to 500 deliveries, one batch
 * in flight, one marker per message, three round trips per batch:
 *
 *   MGET markers                         -> which messages are new
 *   pipeline INCRBY + EXPIRE per SKU     -> counts (summed per SKU over the batch)
 *   pipeline SET marker 1 EX 600         -> markers
 *   multiple-ack up to the batch's last delivery
 *
 * Counts before markers, like Tally's two-step mode: a crash between the two
 * pipelines recounts the batch on redelivery, never loses it. One batch in
 * flight is what keeps it correct: two batches at once could both pass the
 * MGET for copies of one id. Count keys use Tally's layout so the bench
 * verifies every contender the same way; markers are per message
 * (`<prefix>m:<id>`), as such a consumer has no shards.
 */
import amqp, { type ConsumeMessage } from 'amqplib';
import { Redis } from 'ioredis';
import { countKey, shardOf } from '@tally/shared';
import { onTerminate, readSettings, report, warmupReporter } from './protocol.js';

const BATCH = 500;
const settings = readSettings(process.env);
const warmed = warmupReporter(settings.warmup);
const prefix = settings.prefix ?? 'bench:batched:';
const markerTtlS = settings.markerTtlS ?? 600;
const countTtlS = settings.countTtlS ?? 2_592_000;
const virtualShards = settings.virtualShards ?? 16;
const redis = new Redis(settings.redisUrl ?? 'redis://127.0.0.1:6379', { connectionName: 'tally-bench-batched' });
const connection = await amqp.connect(settings.amqpUrl, { clientProperties: { connection_name: 'tally-bench-batched' } });
const channel = await connection.createChannel();
await channel.prefetch(settings.prefetch);

interface Body {
  id?: unknown;
  changes?: Array<{ sku: string; delta: number }>;
}

let acked = 0;
let duplicates = 0;
const samples: Array<[number, number]> = [];
let waiting: ConsumeMessage[] = [];
let running = false;
let timer: NodeJS.Timeout | null = null;

async function runBatch(batch: readonly ConsumeMessage[]): Promise<void> {
  const ids: Array<string | null> = [];
  const bodies: Body[] = [];
  for (const message of batch) {
    const body = JSON.parse(message.content.toString('utf8')) as Body;
    bodies.push(body);
    const id = typeof body.id === 'string' ? body.id : message.properties.messageId;
    ids.push(typeof id === 'string' ? id : null);
  }
  const markers = ids.filter((id): id is string => id !== null).map((id) => `${prefix}m:${id}`);
  const found = markers.length > 0 ? await redis.mget(markers) : [];
  const sums = new Map<string, number>();
  const fresh: string[] = [];
  const seen = new Set<string>();
  let m = 0;
  for (let i = 0; i < batch.length; i++) {
    const id = ids[i];
    if (id === null || id === undefined) continue;
    const marked = found[m++] !== null || seen.has(id);
    seen.add(id);
    if (marked) {
      duplicates++;
      continue;
    }
    fresh.push(`${prefix}m:${id}`);
    for (const { sku, delta } of bodies[i]!.changes ?? []) {
      if (delta === 0) continue;
      const key = countKey(prefix, shardOf(sku, virtualShards), sku);
      sums.set(key, (sums.get(key) ?? 0) + delta);
    }
  }
  if (sums.size > 0) {
    const counts = redis.pipeline();
    for (const [key, sum] of sums) counts.incrby(key, sum).expire(key, countTtlS);
    for (const [error] of (await counts.exec()) ?? []) if (error) throw error;
  }
  if (fresh.length > 0) {
    const marks = redis.pipeline();
    for (const marker of fresh) marks.set(marker, '1', 'EX', markerTtlS);
    for (const [error] of (await marks.exec()) ?? []) if (error) throw error;
  }
  channel.ack(batch[batch.length - 1]!, true);
  acked += batch.length;
  warmed(acked);
  if (settings.recordLatency) {
    const now = Date.now();
    for (const message of batch) {
      const stamp = Number(message.properties.timestamp);
      samples.push([stamp, now - stamp]);
    }
  }
  if (acked === settings.expected) report({ event: 'done', at: Date.now(), acked, duplicates, ...(settings.recordLatency ? { samples } : {}) });
}

/** Runs batches one after another while deliveries wait; a partial batch waits ackWaitMs for company. */
async function pump(): Promise<void> {
  if (running) return;
  running = true;
  try {
    while (waiting.length >= BATCH || (waiting.length > 0 && timer === null)) {
      const batch = waiting.length <= BATCH ? waiting : waiting.slice(0, BATCH);
      waiting = batch === waiting ? [] : waiting.slice(BATCH);
      await runBatch(batch);
    }
  } catch (error) {
    report({ event: 'error', message: error instanceof Error ? error.message : String(error) });
    process.exit(1);
  } finally {
    running = false;
  }
  arm();
}

function arm(): void {
  if (timer !== null || waiting.length === 0 || waiting.length >= BATCH) return;
  timer = setTimeout(() => {
    timer = null;
    void pump();
  }, settings.ackWaitMs);
}

await channel.consume(settings.queue, (message) => {
  if (message === null) return;
  waiting.push(message);
  if (waiting.length >= BATCH) {
    if (timer !== null) {
      clearTimeout(timer);
      timer = null;
    }
    void pump();
  } else if (!running) arm();
});
report({ event: 'consuming', at: Date.now() });

onTerminate(async () => {
  await connection.close().catch(() => {});
  redis.disconnect();
});
