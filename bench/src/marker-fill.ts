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
 * its bucket's filter, are random bytes the client sends (8 per marker), so
 * the client builds each bucket's filter and writes it whole, and the
 * filter is as full as a workload's digests make it (the daemon's
 * pre-check meets as many false "may hold" as in a natural steady state);
 * the last four are the field's number in its hash: distinct within a hash,
 * and across hashes by their first bytes. A workload's
 * digests are SHA-256 of its ids: one of them equals a filled one with
 * probability about (filled × messages) / 2^128, below 10^-24 here, so a
 * filled marker never makes a message of the workload a duplicate.
 *
 * The hashes are written by a script, up to 200,000 markers per call (one
 * HSET and one EXPIREAT per hash, the counts of markers per hash drawn
 * here): tens of millions of fields take seconds, not minutes.
 */
import { randomBytes } from 'node:crypto';
import { Cluster, type Redis } from 'ioredis';
import { filterBlocksFor, filterSlotOf, layoutKey, markerBaseKey, markerMetaKey, MARKER_FORMAT, SHARD_HASH, type TallyMode } from '@tally/shared';
import { seededRandom } from '@tally/workload';
import { expiryBitmap, subBucketCounts, type Population } from './steady-population.js';

/**
 * KEYS[1]  the shard's marker base, <prefix>mk:{<vshard>}
 * ARGV[1]  bucket   ARGV[2] EXPIREAT of its hashes   ARGV[3] its sub-bucket count (a power of two ≤ 65536)
 * ARGV[4]  2 random bytes of this shard's bucket, bytes 3..4 of its digests
 * ARGV[5]  the first sub-bucket of this call
 * ARGV[6]  8 bytes per marker of this call, in order: bytes 5..12 of its digest (the client sets their filter bits)
 * ARGV[7 ..] markers per sub-bucket, from the first on
 * Returns the markers written. Fields per HSET in chunks of 1,000 (unpack's limit is the Lua C stack).
 */
export const FILL_MARKERS_LUA = `
local prefix = KEYS[1] .. ':' .. ARGV[1] .. ':'
local expiresAt = ARGV[2]
local subs = tonumber(ARGV[3])
local tail = ARGV[4]
local first = tonumber(ARGV[5])
local placed = ARGV[6]
local spread = 65536 / subs
local numbers = {}
local at = 1
local written = 0
for i = 7, #ARGV do
  local c = tonumber(ARGV[i])
  if c > 0 then
    local sub = first + i - 7
    local key = prefix .. string.format('%d', sub)
    local head = struct.pack('>H', sub + subs * ((sub * 40503) % spread)) .. tail
    local args = {}
    for j = 1, c do
      -- <2 bytes: the hash's><2 bytes: the bucket's><8 bytes: the client's, its filter place><4 bytes: its number in the hash>
      local number = numbers[j]
      if number == nil then
        number = struct.pack('>I4', j)
        numbers[j] = number
      end
      args[#args + 1] = head .. string.sub(placed, at, at + 7) .. number
      args[#args + 1] = '1'
      at = at + 8
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
return written
`;

/** Sub-buckets per script call: about 90,000 fields at 45 per hash, a few tens of ms of the server's time each. */
const SUBS_PER_CALL = 2_048;
/** Markers per script call at most (16,384-marker hashes fill a call with far fewer sub-buckets): 1.6 MB of filter places. */
const MARKERS_PER_CALL = 200_000;
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

/**
 * Sets, in a filter of 32-bit blocks, the bits of the digest whose bytes
 * 5..12 are placed[at .. at+7]: filterSlotOf's arithmetic (the one the
 * worker's tests check against the scripts), read from `scratch`, a 12-byte
 * buffer whose bytes 5..12 are copied from `placed` (filterSlotOf reads no
 * other byte).
 */
function addToFilter(filter: Uint32Array, placed: Buffer, at: number, scratch: Buffer): void {
  placed.copy(scratch, 4, at, at + 8);
  const { block, bits } = filterSlotOf(scratch, filter.length);
  filter[block] = (filter[block]! | bits) >>> 0;
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
  const scratch = Buffer.alloc(12);
  for (const b of plan.population.buckets) {
    const counts = subBucketCounts(b.markers, b.subBuckets, random);
    const tail = randomBytes(2);
    const blocks = (plan.filterBits ?? 0) > 0 ? filterBlocksFor(b.sizedFor, plan.filterBits!) : 0;
    const filter = blocks > 0 ? new Uint32Array(blocks) : null;
    const base = markerBaseKey(plan.prefix, b.vshard);
    for (let from = 0; from < b.subBuckets;) {
      let to = from;
      let inCall = 0;
      while (to < b.subBuckets && to - from < SUBS_PER_CALL && (inCall === 0 || inCall + counts[to]! <= MARKERS_PER_CALL)) {
        inCall += counts[to]!;
        if (counts[to]! > 0) hashes++;
        to++;
      }
      const slice = counts.subarray(from, to);
      const first = from;
      from = to;
      if (inCall === 0) continue;
      const placed = randomBytes(8 * inCall);
      if (filter !== null) for (let at = 0; at < placed.length; at += 8) addToFilter(filter, placed, at, scratch);
      const args = [1, base, String(b.bucket), String(b.expiresAt), String(b.subBuckets), tail, String(first), placed, ...Array.from(slice, String)] as const;
      // NOSCRIPT: a master the client did not list when the script was loaded (one round of a scale-out run met one); EVAL loads it there.
      await send(redis.evalsha(sha, ...args).catch((error: unknown) => (isNoScript(error) ? redis.eval(FILL_MARKERS_LUA, ...args) : Promise.reject(error))));
    }
    // Its filter, sized and expiring as openBucket makes it, every filled digest's bits set: one SET of blocks × 4 bytes.
    if (filter !== null) {
      const bytes = Buffer.from(filter.buffer, filter.byteOffset, filter.byteLength);
      bytes.swap32(); // BITFIELD u32 words are big-endian
      await send(redis.set(`${base}:${b.bucket}:f`, bytes, 'EXAT', b.expiresAt));
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
