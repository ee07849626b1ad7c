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
 * millions of SETs would cost the bench more than the fill). The expiries
 * are absolute, spread over the TTL from a moment planned for the fill's
 * end, and the fill waits for that moment when it finishes early: with TTLs
 * counted from each key's write, the keys of the fill's first seconds would
 * expire during the fill (5 % of them in a 30 s fill of a 600 s TTL), and the
 * server would reclaim that backlog during the drain, charging it to the
 * reference (one cluster run: 29.8 µs of Redis CPU per message against 11.1
 * fresh). On a cluster
 * the keys carry the consumer's hash tags (`<prefix>m:{m<tag>}:fill-<i>`,
 * consumers/batched.ts), each tag's share by a call routed by one key in
 * its slot.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { Cluster, type Redis } from 'ioredis';
import { MARKER_TAGS, markerStem } from './consumers/batched-markers.js';
import { serverNowS } from './marker-fill.js';

/** Keys written per script call: about 50 ms of Redis each. */
const CHUNK = 50_000;

/** Server seconds per key the fill's end is planned with: measured 4.7 (standalone) and 5.3 µs (cluster) on the loaded 2-core VM. */
const PLANNED_S_PER_KEY = 8e-6;

/**
 * KEYS[1]: a key of the slot written (on a cluster; routes the call).
 * ARGV: the keys' stem, the first index, how many, the TTL, the planned end of the fill (unix seconds).
 */
const FILL_LUA = `
local stem, from, count, ttl, readyAt = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
for i = from, from + count - 1 do
  -- From the fill's end, 1 s to the TTL left, spread evenly: the population a steady rate leaves behind.
  redis.call('SET', stem .. i, '1', 'EXAT', readyAt + 1 + (i * 7919) % ttl)
end
return count
`;

export interface BatchedFill {
  readonly markers: number;
  readonly fillSeconds: number;
  /** Seconds waited after the fill for its planned end (0 when it overran). */
  readonly waitSeconds: number;
  /** Seconds the fill ran past its planned end: the keys with less TTL than that expired during it. */
  readonly overrunSeconds: number;
}

/** rate × TTL marker keys under `prefix`, TTLs spread over (0, TTL]. */
export async function fillBatchedMarkers(redis: Redis | Cluster, prefix: string, rate: number, markerTtlS: number): Promise<BatchedFill> {
  const markers = Math.round(rate * markerTtlS);
  const started = performance.now();
  const readyAt = Math.ceil((await serverNowS(redis)) + markers * PLANNED_S_PER_KEY);
  const tags = redis instanceof Cluster ? Array.from({ length: MARKER_TAGS }, (_, tag) => tag) : [null];
  const stems = tags.map((tag) => `${markerStem(prefix, tag)}fill-`);
  // Each stem's share: the markers split evenly (the consumer's tags are a hash of the id).
  let written = 0;
  for (const [s, stem] of stems.entries()) {
    const share = Math.round((markers * (s + 1)) / stems.length) - Math.round((markers * s) / stems.length);
    for (let from = 0; from < share; from += CHUNK) await redis.eval(FILL_LUA, 1, `${stem}0`, stem, from, Math.min(CHUNK, share - from), markerTtlS, readyAt);
    written += share;
  }
  const fillSeconds = (performance.now() - started) / 1000;
  const leftS = readyAt - (await serverNowS(redis));
  if (leftS > 0) await sleep(leftS * 1000);
  return { markers: written, fillSeconds, waitSeconds: Math.max(0, leftS), overrunSeconds: Math.max(0, -leftS) };
}
