/**
 * --steady-state: the write receipts a steady rate leaves behind, beside the
 * markers (marker-fill.ts). Each batch that writes counts leaves one, a
 * `SET … EX` key of the marker TTL (`<prefix>w:{<vshard>}:<batch id>`,
 * docs/architecture.md, "Redis keys"), so a natural steady state holds
 * batches per second × TTL of them: about 190,000 at 3,000 msg/s and the
 * default 600 s. A fill of markers alone left the keyspace that much smaller
 * and nothing of them to expire, and flattered every key lookup the daemon
 * makes (`pnpm bench --natural-check`, docs/benchmark.md).
 *
 * Written server-side, one script call per shard and chunk, their TTLs spread
 * evenly over the TTL so they expire during the drain at the rate a natural
 * run writes them. On a cluster each call is routed by a key of its shard's
 * slot (the `{<vshard>}` hash tag).
 */
import type { Cluster, Redis } from 'ioredis';
import { receiptKey } from '@tally/shared';

/** Receipts per script call. */
const CHUNK = 50_000;

/**
 * KEYS[1]  the first receipt of the call (routes it to its shard's slot)
 * ARGV     the receipts' stem (<prefix>w:{<vshard>}:fill-), the first index, how many, the TTL
 */
const FILL_RECEIPTS_LUA = `
local stem, from, count, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = from, from + count - 1 do
  redis.call('SET', stem .. i, '1', 'EX', 1 + (i * 7919) % ttl)
end
return count
`;

/**
 * Receipts a steady rate writes per second: one per count batch, and a
 * shard's lane closes a batch at `batchSize` parts or `batchWaitMs` after
 * it opened, whichever comes first (so at most one batch per part, at least
 * one per batchSize parts). `countShares`: per virtual shard, the parts per
 * message its counts get (partsPerMessageByShard).
 */
export function receiptsPerSecond(rate: number, countShares: readonly number[], batchSize: number, batchWaitMs: number): number {
  let total = 0;
  for (const share of countShares) {
    const parts = rate * share;
    if (parts > 0) total += Math.max(Math.min(parts, 1_000 / Math.max(1, batchWaitMs)), parts / batchSize);
  }
  return total;
}

/** Per virtual shard, `perSecond × TTL` receipts in all, split by the shards' count shares. Returns how many were written. */
export async function fillReceipts(
  redis: Redis | Cluster,
  plan: { prefix: string; rate: number; countShares: readonly number[]; batchSize: number; batchWaitMs: number; markerTtlS: number },
): Promise<number> {
  let written = 0;
  for (const [vshard, share] of plan.countShares.entries()) {
    const receipts = Math.round(receiptsPerSecond(plan.rate, [share], plan.batchSize, plan.batchWaitMs) * plan.markerTtlS);
    const stem = receiptKey(plan.prefix, vshard, 'fill-');
    for (let from = 0; from < receipts; from += CHUNK) {
      const count = Math.min(CHUNK, receipts - from);
      written += Number(await redis.eval(FILL_RECEIPTS_LUA, 1, `${stem}${from}`, stem, from, count, plan.markerTtlS));
    }
  }
  return written;
}
