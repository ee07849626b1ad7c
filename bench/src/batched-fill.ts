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
 * millions of SETs would cost the bench more than the fill).
 */
import type { Redis } from 'ioredis';

/** Keys written per script call: about 50 ms of Redis each. */
const CHUNK = 50_000;

const FILL_LUA = `
local prefix, from, count, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = from, from + count - 1 do
  -- TTLs from 1 s to the TTL, spread evenly: the population a steady rate leaves behind.
  redis.call('SET', prefix .. 'm:fill-' .. i, '1', 'EX', 1 + (i * 7919) % ttl)
end
return count
`;

export interface BatchedFill {
  readonly markers: number;
  readonly fillSeconds: number;
}

/** rate × TTL marker keys under `prefix`, TTLs spread over (0, TTL]. */
export async function fillBatchedMarkers(redis: Redis, prefix: string, rate: number, markerTtlS: number): Promise<BatchedFill> {
  const markers = Math.round(rate * markerTtlS);
  const started = performance.now();
  for (let from = 0; from < markers; from += CHUNK) await redis.eval(FILL_LUA, 0, prefix, from, Math.min(CHUNK, markers - from), markerTtlS);
  return { markers, fillSeconds: (performance.now() - started) / 1000 };
}
