/**
 * Watching the daemon from outside, since it reports nothing per message:
 * a drain is over when Redis holds every count of the truth and the queue
 * has no ready message. The markers and acks of the last batches follow
 * within one Redis round trip; the stop afterwards (SIGTERM finishes and
 * acks what is in flight) and the empty-queue check after it prove they did.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type amqp from 'amqplib';
import { countKey, shardOf } from '@tally/shared';
import type { AnyBenchContext } from './context.js';
import { keyGroups } from './key-groups.js';

export interface WatchResult {
  /** Epoch ms when the drain was seen complete; null on a stall. */
  readonly at: number | null;
  /** Commands the watcher itself sent to Redis (subtracted from the contender's). */
  readonly ownCommands: number;
  readonly pendingSkus: number;
}

const MGET_CHUNK = 2_000;

export async function watchCounts(
  ctx: AnyBenchContext,
  channel: amqp.Channel,
  queue: string,
  prefix: string,
  truth: ReadonlyMap<string, number>,
  options: { intervalMs?: number; stallMs?: number } = {},
): Promise<WatchResult> {
  const intervalMs = options.intervalMs ?? 20;
  const stallMs = options.stallMs ?? 15_000;
  // Only SKUs not yet at their truth are read again: the set shrinks as the drain proceeds.
  let pending = [...truth].map(([sku, want]) => {
    const vshard = shardOf(sku, ctx.virtualShards);
    return { key: countKey(prefix, vshard, sku), vshard, want };
  });
  // On a cluster one MGET per shard (one slot); on a standalone server chunks of any keys.
  const bySlot = ctx.nodes.topology === 'cluster';
  let ownCommands = 0;
  let lastProgress = Date.now();
  for (;;) {
    const before = pending.length;
    const still: typeof pending = [];
    for (const chunk of keyGroups(pending, bySlot, MGET_CHUNK)) {
      const values = await ctx.redis.mget(chunk.map((p) => p.key));
      ownCommands++;
      chunk.forEach((p, j) => {
        if (Number(values[j] ?? 0) !== p.want) still.push(p);
      });
    }
    pending = still;
    if (pending.length === 0) {
      const { messageCount } = await channel.checkQueue(queue);
      if (messageCount === 0) return { at: Date.now(), ownCommands, pendingSkus: 0 };
    }
    if (pending.length < before) lastProgress = Date.now();
    else if (Date.now() - lastProgress > stallMs) return { at: null, ownCommands, pendingSkus: pending.length };
    await sleep(intervalMs);
  }
}
