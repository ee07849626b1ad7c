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
 *
 * On a Redis Cluster (redisUrl: seed URLs separated by commas) it does what a
 * careful user would: a multi-key MGET must stay in one slot, so markers
 * carry one of MARKER_TAGS hash tags (`<prefix>m:{m<tag>}:<id>`, the tag a
 * hash of the id) and the MGET goes per tag; every command is sent through
 * ioredis's auto-pipelining, which batches per node. Round trips per batch
 * stay three, one pipeline per master each.
 */
import amqp, { type ConsumeMessage } from 'amqplib';
import { Cluster, Redis } from 'ioredis';
import { countKey, shardOf, splitRedisUrls } from '@tally/shared';
import { markerStem, markerTagOf } from './batched-markers.js';
import { onTerminate, readSettings, report, warmupReporter } from './protocol.js';

const BATCH = 500;
const settings = readSettings(process.env);
const warmed = warmupReporter(settings.warmup);
const prefix = settings.prefix ?? 'bench:batched:';
const markerTtlS = settings.markerTtlS ?? 600;
const countTtlS = settings.countTtlS ?? 2_592_000;
const virtualShards = settings.virtualShards ?? 16;
const seeds = splitRedisUrls(settings.redisUrl ?? 'redis://127.0.0.1:6379');
const onCluster = seeds.length > 1;
const redis = onCluster
  ? new Cluster(
      seeds.map((url) => ({ host: new URL(url).hostname, port: Number(new URL(url).port) })),
      { enableAutoPipelining: true, redisOptions: { connectionName: 'tally-bench-batched' } },
    )
  : new Redis(seeds[0]!, { connectionName: 'tally-bench-batched' });
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

function markerKey(id: string): string {
  return markerStem(prefix, onCluster ? markerTagOf(id) : null) + id;
}

/** Whether each id's marker is set: one MGET on a standalone Redis, one per hash tag on a cluster (a multi-key command stays in one slot). */
async function findMarkers(ids: readonly string[]): Promise<Array<string | null>> {
  if (ids.length === 0) return [];
  if (!onCluster) return redis.mget(...ids.map(markerKey));
  const byTag = new Map<number, number[]>();
  ids.forEach((id, i) => {
    const tag = markerTagOf(id);
    const positions = byTag.get(tag) ?? [];
    positions.push(i);
    byTag.set(tag, positions);
  });
  const found: Array<string | null> = new Array<string | null>(ids.length).fill(null);
  await Promise.all(
    [...byTag.values()].map(async (positions) => {
      const values = await redis.mget(...positions.map((i) => markerKey(ids[i]!)));
      positions.forEach((at, j) => (found[at] = values[j] ?? null));
    }),
  );
  return found;
}

/** Counts summed per SKU: INCRBY + EXPIRE per key, one pipeline (on a cluster, auto-pipelining's one per master). */
async function writeCounts(sums: ReadonlyMap<string, number>): Promise<void> {
  if (sums.size === 0) return;
  if (onCluster) {
    await Promise.all([...sums].flatMap(([key, sum]) => [redis.incrby(key, sum), redis.expire(key, countTtlS)]));
    return;
  }
  const counts = redis.pipeline();
  for (const [key, sum] of sums) counts.incrby(key, sum).expire(key, countTtlS);
  for (const [error] of (await counts.exec()) ?? []) if (error) throw error;
}

/** The batch's new markers, SET … EX each, pipelined as the counts are. */
async function writeMarkers(fresh: readonly string[]): Promise<void> {
  if (fresh.length === 0) return;
  if (onCluster) {
    await Promise.all(fresh.map((marker) => redis.set(marker, '1', 'EX', markerTtlS)));
    return;
  }
  const marks = redis.pipeline();
  for (const marker of fresh) marks.set(marker, '1', 'EX', markerTtlS);
  for (const [error] of (await marks.exec()) ?? []) if (error) throw error;
}

async function runBatch(batch: readonly ConsumeMessage[]): Promise<void> {
  const ids: Array<string | null> = [];
  const bodies: Body[] = [];
  for (const message of batch) {
    const body = JSON.parse(message.content.toString('utf8')) as Body;
    bodies.push(body);
    const id = typeof body.id === 'string' ? body.id : message.properties.messageId;
    ids.push(typeof id === 'string' ? id : null);
  }
  const found = await findMarkers(ids.filter((id): id is string => id !== null));
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
    fresh.push(markerKey(id));
    for (const { sku, delta } of bodies[i]!.changes ?? []) {
      if (delta === 0) continue;
      const key = countKey(prefix, shardOf(sku, virtualShards), sku);
      sums.set(key, (sums.get(key) ?? 0) + delta);
    }
  }
  await writeCounts(sums);
  await writeMarkers(fresh);
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
