/**
 * Fills a prefix's marker store with a steady-state population
 * (steady-population.ts), server-side, laid out as the daemon's scripts lay
 * it out (packages/worker/src/lua/include/marker_buckets.lua; the keys are
 * described in docs/architecture.md, "Redis keys"): the marker hashes with
 * 16-byte digest fields valued '1' (done), their meta hashes, each with the
 * bucket's EXPIREAT, and <prefix>layout as a daemon of the contender's mode
 * recorded it when it created the prefix.
 *
 * Digests: the first two bytes pick the hash (their value modulo the
 * sub-bucket count is the hash's number, as for a real digest), then two
 * random bytes per shard and bucket; bytes 5..12, which place a digest in
 * its bucket's filter, are drawn at random by the script (seeded per call),
 * so the filter is as full as a workload's digests make it and the daemon's
 * pre-check meets as many false "may hold" as in a natural steady state;
 * the last four are the field's number in its hash: distinct within a hash,
 * and across hashes by their first bytes. A workload's
 * digests are SHA-256 of its ids: one of them equals a filled one with
 * probability about (filled × messages) / 2^128, below 10^-24 here, so a
 * filled marker never makes a message of the workload a duplicate.
 *
 * The hashes are written by a script, a few thousand hashes per call (one
 * HSET and one EXPIREAT per hash, the counts of markers per hash drawn
 * here): tens of millions of fields take seconds, not minutes.
 */
import { randomBytes } from 'node:crypto';
import { Cluster, type Redis } from 'ioredis';
import { filterBlocksFor, layoutKey, markerBaseKey, markerMetaKey, MARKER_FORMAT, SHARD_HASH, type TallyMode } from '@tally/shared';
import { seededRandom } from '@tally/workload';
import { expiryBitmap, subBucketCounts, type Population } from './steady-population.js';

/**
 * KEYS[1]  the shard's marker base, <prefix>mk:{<vshard>}
 * ARGV[1]  bucket   ARGV[2] EXPIREAT of its hashes   ARGV[3] its sub-bucket count (a power of two ≤ 65536)
 * ARGV[4]  10 random bytes of this shard's bucket: 2 in every digest, the last 4 seed bytes 5..12
 * ARGV[5]  the first sub-bucket of this call
 * ARGV[6]  the bucket's filter blocks (0: no filter; message-scoped markers have one, marker_buckets.lua)
 * ARGV[7 ..] markers per sub-bucket, from the first on
 * Returns the markers written. Fields per HSET in chunks of 1,000 (unpack's limit is the Lua C stack).
 */
export const FILL_MARKERS_LUA = `
local prefix = KEYS[1] .. ':' .. ARGV[1] .. ':'
local expiresAt = ARGV[2]
local subs = tonumber(ARGV[3])
local tail = ARGV[4]
local first = tonumber(ARGV[5])
local blocks = tonumber(ARGV[6])
local spread = 65536 / subs
local tailA = string.sub(tail, 1, 2)
-- Seeded per call: a rerun of the fill lays out the same digests.
math.randomseed(struct.unpack('>I4', string.sub(tail, 7, 10)) + first)
local BIT = {}
for i = 0, 31 do BIT[i] = bit.lshift(1, i) end
local filter, order = {}, {}
local written = 0
for i = 7, #ARGV do
  local c = tonumber(ARGV[i])
  if c > 0 then
    local sub = first + i - 7
    local key = prefix .. string.format('%d', sub)
    local head = struct.pack('>H', sub + subs * ((sub * 40503) % spread))
    local args = {}
    for j = 1, c do
      -- Bytes 5..8 and 9..12 place the digest in its bucket's filter (marker_buckets.lua coordinatesOf): drawn at
      -- random, as a workload's are, so that the filter is as full as a natural run makes it; bytes 13..16, its number
      -- in the hash, keep the fields of a hash distinct.
      local word = math.random(0, 65535) * 65536 + math.random(0, 65535)
      local word2 = math.random(0, 65535) * 65536 + math.random(0, 65535)
      args[#args + 1] = head .. tailA .. struct.pack('>I4I4I4', word, word2, j)
      args[#args + 1] = '1'
      if blocks > 0 then
        local block = word % blocks
        local bits = bit.bor(
          BIT[math.floor(word2 / 16777216) % 32],
          BIT[math.floor(word2 / 65536) % 32],
          BIT[math.floor(word2 / 256) % 32],
          BIT[word2 % 32])
        if filter[block] == nil then order[#order + 1] = block end
        filter[block] = bit.bor(filter[block] or 0, bits)
      end
      if #args >= 2000 then
        redis.call('HSET', key, unpack(args))
        args = {}
      end
    end
    if #args > 0 then redis.call('HSET', key, unpack(args)) end
    redis.call('EXPIREAT', key, expiresAt)
    written = written + c
  end
end
-- The filter bits of this call's digests, as marker_buckets.lua addToFilter sets them.
if blocks > 0 then
  local filterKey = KEYS[1] .. ':' .. ARGV[1] .. ':f'
  for from = 1, #order, 1000 do
    local to = math.min(from + 999, #order)
    local args = {}
    for i = from, to do
      args[#args + 1] = 'GET'
      args[#args + 1] = 'u32'
      args[#args + 1] = '#' .. order[i]
    end
    local words = redis.call('BITFIELD', filterKey, unpack(args))
    args = {}
    for i = from, to do
      args[#args + 1] = 'SET'
      args[#args + 1] = 'u32'
      args[#args + 1] = '#' .. order[i]
      args[#args + 1] = string.format('%d', bit.bor(words[i - from + 1], filter[order[i]]) % 4294967296)
    end
    redis.call('BITFIELD', filterKey, unpack(args))
  end
end
return written
`;

/** Sub-buckets per script call: about 90,000 fields at 45 per hash, a few tens of ms of the server's time each. */
const SUBS_PER_CALL = 2_048;
/** Calls in flight at once: enough to keep the server busy, few enough to keep the client's memory small. */
const CALLS_IN_FLIGHT = 4;

export interface FillPlan {
  readonly prefix: string;
  readonly population: Population;
  /** Seeds the markers-per-hash draw. */
  readonly seed: number;
  /** Filter bits per marker (markerFilterBits): each bucket gets its filter, as a bucket the daemon opens does. */
  readonly filterBits?: number;
}

export interface FillReport {
  readonly markers: number;
  readonly hashes: number;
  /** Shard buckets (meta hashes) written. */
  readonly buckets: number;
  readonly seconds: number;
}

/** The server's clock, seconds with microseconds (what the scripts' TIME reads). */
export async function serverNowS(redis: Redis | Cluster): Promise<number> {
  const [seconds, micros] = await redis.time();
  return Number(seconds) + Number(micros) / 1e6;
}

/**
 * The layout a daemon of `mode` records when it creates a prefix
 * (coordinator/src/fleet/layout-guard.ts): a daemon starting on the filled prefix
 * finds an existing prefix of its own mode, with the bucket width the
 * markers were laid out with, and verifies it instead of creating it.
 */
export async function writeLayout(
  redis: Redis | Cluster,
  layout: { prefix: string; virtualShards: number; mode: TallyMode; bucketS: number; subBuckets: number; format?: string; createdAt?: Date },
): Promise<void> {
  await redis.hset(layoutKey(layout.prefix), {
    virtual_shards: String(layout.virtualShards),
    hash: SHARD_HASH,
    created_at: (layout.createdAt ?? new Date(Date.now() - 3_600_000)).toISOString(),
    mode: layout.mode,
    marker_format: layout.format ?? MARKER_FORMAT,
    marker_bucket_s: String(layout.bucketS),
    marker_sub_buckets: String(layout.subBuckets),
  });
}

function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT');
}

/** Loads a script where EVALSHA will find it: the server, or every master of a cluster (a shard's keys may be on any). */
async function loadEverywhere(redis: Redis | Cluster, script: string): Promise<string> {
  const servers = redis instanceof Cluster ? redis.nodes('master') : [redis];
  const shas = await Promise.all(servers.map((server) => server.script('LOAD', script) as Promise<string>));
  return shas[0]!;
}

export async function fillMarkers(redis: Redis | Cluster, plan: FillPlan): Promise<FillReport> {
  const started = performance.now();
  const sha = await loadEverywhere(redis, FILL_MARKERS_LUA);
  const random = seededRandom(plan.seed);
  let markers = 0;
  let hashes = 0;
  let buckets = 0;
  const inFlight = new Set<Promise<unknown>>();
  let failure: unknown = null;
  const send = async (call: Promise<unknown>) => {
    const tracked: Promise<unknown> = call
      .catch((error: unknown) => {
        failure ??= error;
      })
      .finally(() => inFlight.delete(tracked));
    inFlight.add(tracked);
    if (inFlight.size >= CALLS_IN_FLIGHT) await Promise.race(inFlight);
    if (failure !== null) throw failure;
  };
  for (const b of plan.population.buckets) {
    const counts = subBucketCounts(b.markers, b.subBuckets, random);
    const tail = randomBytes(10);
    const blocks = (plan.filterBits ?? 0) > 0 ? filterBlocksFor(b.sizedFor, plan.filterBits!) : 0;
    const base = markerBaseKey(plan.prefix, b.vshard);
    // Its filter first, sized and expiring as openBucket makes it: the calls below set its bits (one connection: in order).
    if (blocks > 0)
      await send(
        redis
          .multi()
          .call('BITFIELD', `${base}:${b.bucket}:f`, 'SET', 'u32', `#${blocks - 1}`, '0')
          .expireat(`${base}:${b.bucket}:f`, b.expiresAt)
          .exec(),
      );
    for (let from = 0; from < b.subBuckets; from += SUBS_PER_CALL) {
      const slice = counts.subarray(from, Math.min(from + SUBS_PER_CALL, b.subBuckets));
      let inSlice = 0;
      for (const c of slice) {
        inSlice += c;
        if (c > 0) hashes++;
      }
      if (inSlice === 0) continue;
      const args = [
        1,
        base,
        String(b.bucket),
        String(b.expiresAt),
        String(b.subBuckets),
        tail,
        String(from),
        String(blocks),
        ...Array.from(slice, String),
      ] as const;
      // NOSCRIPT: a master the client did not list when the script was loaded (one round of a scale-out run met one); EVAL loads it there.
      await send(redis.evalsha(sha, ...args).catch((error: unknown) => (isNoScript(error) ? redis.eval(FILL_MARKERS_LUA, ...args) : Promise.reject(error))));
    }
    // The meta hash as openBucket and writeMarkers leave it: opened (s) with the bucket's expiry, n markers, x the hashes made.
    const meta = markerMetaKey(plan.prefix, b.vshard, b.bucket);
    const bitmap = expiryBitmap(counts);
    await send(
      redis
        .multi()
        .hset(
          meta,
          's',
          String(b.subBuckets),
          'n',
          String(b.markers),
          ...(bitmap.length > 0 ? ['x', bitmap] : []),
          ...(blocks > 0 ? ['f', String(blocks)] : []),
        )
        .expireat(meta, b.expiresAt)
        .exec(),
    );
    markers += b.markers;
    buckets++;
  }
  await Promise.all(inFlight);
  if (failure !== null) throw failure;
  return { markers, hashes, buckets, seconds: (performance.now() - started) / 1000 };
}
