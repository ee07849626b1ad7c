/**
 * --steady-state for the hand-written batched consumer: its Redis holds, as
 * in production, the markers the last marker TTL left, one `SET … EX` key per
 * message (`<prefix>m:<id>`), their TTLs spread evenly over the TTL so they
 * expire during the drain at the rate they were written. Without it the
 * reference would run fresh against Tally's steady state, which flatters it:
 * Redis's CPU per message grows with the keyspace (expiry cycles, a larger
 * main dictionary to rehash and look up).
 *
 * Written server-side, in chunks of one script call each (a pipeline of
 * millions of SETs would cost the bench more than the fill). On a cluster
 * the keys carry the consumer's hash tags (`<prefix>m:{m<tag>}:fill-<i>`,
 * consumers/batched.ts), each tag's share by a call routed by one key in
 * its slot.
 */
import { Cluster, type Redis } from 'ioredis';

/** Keys written per script call: about 50 ms of Redis each. */
const CHUNK = 50_000;

/** KEYS[1]: a key of the slot written (on a cluster; routes the call). ARGV: the keys' stem, the first index, how many, the TTL. */
const FILL_LUA = `
local stem, from, count, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = from, from + count - 1 do
  -- TTLs from 1 s to the TTL, spread evenly: the population a steady rate leaves behind.
  redis.call('SET', stem .. i, '1', 'EX', 1 + (i * 7919) % ttl)
end
return count
`;

/** The consumer's hash tags on a cluster (consumers/batched.ts, MARKER_TAGS). */
const CLUSTER_MARKER_TAGS = 16;

export interface BatchedFill {
  readonly markers: number;
  readonly fillSeconds: number;
}

/** rate × TTL marker keys under `prefix`, TTLs spread over (0, TTL]. */
export async function fillBatchedMarkers(redis: Redis | Cluster, prefix: string, rate: number, markerTtlS: number): Promise<BatchedFill> {
  const markers = Math.round(rate * markerTtlS);
  const started = performance.now();
  const stems = redis instanceof Cluster ? Array.from({ length: CLUSTER_MARKER_TAGS }, (_, tag) => `${prefix}m:{m${tag}}:fill-`) : [`${prefix}m:fill-`];
  // Each stem's share: the markers split evenly (the consumer's tags are a hash of the id).
  let written = 0;
  for (const [s, stem] of stems.entries()) {
    const share = Math.round((markers * (s + 1)) / stems.length) - Math.round((markers * s) / stems.length);
    for (let from = 0; from < share; from += CHUNK) await redis.eval(FILL_LUA, 1, `${stem}0`, stem, from, Math.min(CHUNK, share - from), markerTtlS);
    written += share;
  }
  return { markers: written, fillSeconds: (performance.now() - started) / 1000 };
}
