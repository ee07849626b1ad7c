/**
 * --steady-state: the write receipts a steady rate leaves behind, beside the
 * markers (marker-fill.ts). Each batch that writes counts leaves one, a
 * `SET … EX` key of the marker TTL (`<prefix>w:{<vshard>}:<batch id>`,
 * docs/architecture.md, "Redis keys"), so a natural steady state holds
 * batches per second × TTL of them: about 48,000 at 3,000 msg/s and the
 * default 600 s on one Redis (four batch lanes, 20 batches a second each;
 * `pnpm bench --natural-check` counted 43,771 in a natural run). A fill of
 * markers alone left them out: a smaller keyspace, and none to expire.
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
 * Receipts a steady rate writes per second. A batch lane closes a batch at
 * `batchSize` parts or `batchWaitMs` after it opened, whichever comes first
 * (so at most one batch per part, at least one per batchSize parts), and
 * each batch that writes counts leaves one receipt, or, when its counts are
 * written per slot (message-scoped markers on a cluster), one per count
 * shard it touches.
 *
 * `laneShares`: per batch lane (virtual shard), the parts per message it
 * batches (steadyShares: one marker per message spread over the marker
 * shards for message-scoped markers, the workload's parts otherwise).
 * `countShares`, only for counts written per slot: per virtual shard, the
 * parts per message its counts get (steadyCountShares).
 */
export function receiptsPerSecond(plan: {
  rate: number;
  laneShares: readonly number[];
  batchSize: number;
  batchWaitMs: number;
  countShares?: readonly number[];
}): number {
  let total = 0;
  for (const share of plan.laneShares) {
    const parts = plan.rate * share;
    if (!(parts > 0)) continue;
    const batches = Math.max(Math.min(parts, 1_000 / Math.max(1, plan.batchWaitMs)), parts / plan.batchSize);
    const perBatch = parts / batches;
    // A batch of m messages touches count shard v unless none of them has a part there.
    const receipts = plan.countShares === undefined ? 1 : plan.countShares.reduce((sum, q) => sum + 1 - (1 - Math.min(1, q)) ** perBatch, 0);
    total += batches * receipts;
  }
  return total;
}

function spread(total: number, weights: readonly number[]): number[] {
  const sum = weights.reduce((a, b) => a + b, 0);
  return weights.map((w) => (sum > 0 ? Math.round((total * w) / sum) : 0));
}

/**
 * `receiptsPerSecond × TTL` receipts, each under the shard of the lane that
 * wrote it (for counts written per slot, spread over the count shards by
 * their shares). Returns how many were written.
 */
export async function fillReceipts(
  redis: Redis | Cluster,
  plan: {
    prefix: string;
    rate: number;
    laneShares: readonly number[];
    countShares?: readonly number[];
    batchSize: number;
    batchWaitMs: number;
    markerTtlS: number;
  },
): Promise<number> {
  // By lane, its own batches; with counts per slot, the batches' receipts spread over the count shards by their shares.
  const perShard =
    plan.countShares === undefined
      ? plan.laneShares.map((share) => Math.round(receiptsPerSecond({ ...plan, laneShares: [share] }) * plan.markerTtlS))
      : spread(Math.round(receiptsPerSecond(plan) * plan.markerTtlS), plan.countShares);
  let written = 0;
  for (const [vshard, receipts] of perShard.entries()) {
    const stem = receiptKey(plan.prefix, vshard, 'fill-');
    for (let from = 0; from < receipts; from += CHUNK) {
      const count = Math.min(CHUNK, receipts - from);
      written += Number(await redis.eval(FILL_RECEIPTS_LUA, 1, `${stem}${from}`, stem, from, count, plan.markerTtlS));
    }
  }
  return written;
}
