/**
 * Pure: the marker format. A marker says "this message's part for this
 * virtual shard is counted"; it is a field of a small time-bucketed hash,
 * keyed by the first 16 bytes of SHA-256 of the message id. The layout (the
 * keys, digest, buckets, sub-buckets, filters and what the layout hash
 * records) is described once, in docs/architecture.md ("Redis keys",
 * "Markers", "Marker filters").
 *
 * The scripts (packages/worker/src/lua) do this arithmetic themselves, on the
 * server's clock; these functions are the same arithmetic for tooling and
 * tests, and the worker tests check that both agree.
 */
import { hash } from 'node:crypto';
import { ScriptReply } from './script-replies.js';

/** Recorded as `marker_format` in the layout hash; a prefix with live markers of another format is refused. */
export const MARKER_FORMAT = 'digest16-buckets-v1';
/**
 * The same buckets with one marker per message instead of one per part
 * (TALLY_MARKER_SCOPE=message; on a Redis Cluster two-step mode only): a
 * message's marker lives on the virtual shard of its digest
 * (markerShardOf), and the batch that holds it writes all its changes,
 * whatever their SKUs' shards (on a cluster, one write per shard's slot).
 */
export const MESSAGE_MARKER_FORMAT = 'digest16-message-buckets-v1';

/**
 * Message-scoped markers with fenced adoption (worker/src/fenced-adoption.ts):
 * what a new prefix of atomic mode on a Redis Cluster is laid out with. A
 * batch's counts are written per count shard as in two-step mode, and the
 * double count two-step allows (a crash between the count writes and the
 * occupation) is closed where it would happen: the batch that takes the
 * claim over reads, on each count shard, whether the claim's batch counted
 * the message there, and fences it out where it did not. Its own format
 * because every writer must take part: a claim without its batch id cannot
 * be adopted, and an older build would read a fence as a receipt.
 */
export const FENCED_MESSAGE_MARKER_FORMAT = 'digest16-message-fenced-v1';

/**
 * Part-scoped markers whose buckets keep filters (marker_buckets.lua), as
 * message-scoped ones do: what a new part-scoped prefix is laid out with
 * (atomic mode and streams on a Redis Cluster). Its own format because the
 * filter is only sound when every writer sets its bits: builds from before
 * it refuse the format at start, and prefixes of MARKER_FORMAT keep their
 * unfiltered buckets (filterBitsOfFormat).
 */
export const FILTERED_MARKER_FORMAT = 'digest16-filtered-buckets-v1';

/**
 * What one marker stands for. `part`: a message's changes on one virtual
 * shard (a message of changes on four shards has four markers). `message`:
 * the whole message, so a pre-check and an occupation cost one field per
 * message, not one per part.
 */
export type MarkerScope = 'part' | 'message';

/** The scope a recorded marker format stands for; null for a format this build does not write. */
export function markerScopeOf(format: string): MarkerScope | null {
  if (format === MARKER_FORMAT || format === FILTERED_MARKER_FORMAT) return 'part';
  if (format === MESSAGE_MARKER_FORMAT || format === FENCED_MESSAGE_MARKER_FORMAT) return 'message';
  return null;
}

/** Whether a recorded marker format's batches take claims over by fenced adoption. */
export function fencedAdoptionOf(format: string): boolean {
  return format === FENCED_MESSAGE_MARKER_FORMAT;
}

/**
 * Whether batches of whole messages (message-scoped markers) can write
 * their counts here. A message's counts span hash slots on a Redis Cluster:
 * a queue's batches write them per slot before they occupy the message's
 * marker (cross-slot-counts.ts; atomic mode with fenced adoption,
 * needsFencedAdoption), but a stream's batch is one script, which cannot
 * span slots.
 */
export function messageScopeServes(topology: 'standalone' | 'cluster', mode: 'two-step' | 'atomic', source: 'queue' | 'stream'): boolean {
  return topology === 'standalone' || source === 'queue';
}

/**
 * Atomic mode's promise (no double count after a crash) with message-scoped
 * markers on a Redis Cluster: only fenced adoption keeps it, because the
 * counts cannot be written in the marker's script there.
 */
export function needsFencedAdoption(topology: 'standalone' | 'cluster', mode: 'two-step' | 'atomic', source: 'queue' | 'stream'): boolean {
  return topology === 'cluster' && mode === 'atomic' && source === 'queue';
}

/**
 * The scope a new prefix is laid out with when TALLY_MARKER_SCOPE is not
 * set: one marker per message wherever it serves (about a fifth of the
 * Redis CPU per message of part scope at production population,
 * docs/benchmark.md), else one per part.
 */
export function defaultMarkerScope(topology: 'standalone' | 'cluster', mode: 'two-step' | 'atomic', source: 'queue' | 'stream' = 'queue'): MarkerScope {
  return messageScopeServes(topology, mode, source) ? 'message' : 'part';
}

/** The format a new prefix of `scope` is laid out with; `fenced`: message scope with fenced adoption. */
export function markerFormatOf(scope: MarkerScope, fenced = false): string {
  if (scope === 'message') return fenced ? FENCED_MESSAGE_MARKER_FORMAT : MESSAGE_MARKER_FORMAT;
  return FILTERED_MARKER_FORMAT;
}

/**
 * Message scope: how many of the virtual shards take messages (their lanes,
 * threads and marker hashes): at most four. A batch's count increments are
 * one per distinct SKU, so the larger a lane's batches the fewer per
 * message: with the default prefetch of 2,000 spread over 16 lanes a batch
 * held about 125 messages and 2.2 increments per message on the bench's
 * workload (3,000 SKUs, Zipf 1), over 4 lanes about 500 and 1.5. Four lanes
 * still keep four batches in flight, and four threads, which do a message's
 * aggregation in a few microseconds, are more than one Redis needs.
 * Derived from the prefix's recorded virtual shards, so every daemon agrees.
 */
export const MESSAGE_MARKER_SHARDS = 4;

export function messageMarkerShards(virtualShards: number): number {
  return Math.min(MESSAGE_MARKER_SHARDS, virtualShards);
}

/**
 * Message scope: the virtual shard whose lane, thread and marker hashes
 * take a message (one of the first messageMarkerShards), from the digest's
 * last four bytes. Not from its first two: those pick the sub-bucket inside
 * the shard, and a shard taken from the same bytes would use only some of
 * the sub-buckets.
 */
export function markerShardOf(digest: Uint8Array | DigestText, virtualShards: number): number {
  const at = MARKER_DIGEST_BYTES - 4;
  const word =
    typeof digest === 'string'
      ? ((digest.charCodeAt(at) << 24) | (digest.charCodeAt(at + 1) << 16) | (digest.charCodeAt(at + 2) << 8) | digest.charCodeAt(at + 3)) >>> 0
      : ((digest[at]! << 24) | (digest[at + 1]! << 16) | (digest[at + 2]! << 8) | digest[at + 3]!) >>> 0;
  return word % messageMarkerShards(virtualShards);
}

/**
 * Bits of filter per marker a bucket is sized for (marker_buckets.lua): with
 * message-scoped markers every bucket a script opens gets a blocked Bloom
 * filter of its digests, so a pre-check reads the marker hashes only for
 * the digests it may hold (about 3 % of messages are duplicates; the filter
 * adds well under 1 % of false "may hold"). It never misses a digest
 * written to its bucket. A prefix of MARKER_FORMAT keeps none: builds from
 * before the filter wrote its buckets without setting its bits.
 */
export const FILTER_BITS = 12;

export function filterBitsOfFormat(format: string): number {
  return format === MESSAGE_MARKER_FORMAT || format === FILTERED_MARKER_FORMAT || format === FENCED_MESSAGE_MARKER_FORMAT ? FILTER_BITS : 0;
}

/**
 * The filter bits a thread's scripts use: the prefix's recorded format's
 * (settings.markerFilterBits, set by the daemon from the layout); without
 * it (tests, tools), message scope's and none for part scope, as before
 * FILTERED_MARKER_FORMAT.
 */
export function markerFilterBits(scope: MarkerScope | undefined, recorded?: number): number {
  if (recorded !== undefined) return recorded;
  return scope === 'message' ? FILTER_BITS : 0;
}

/**
 * The 32-bit blocks of a bucket's filter (marker_buckets.lua openBucket):
 * room for twice the markers it expects, the bucket before's (or, when that
 * one is unknown, the initial sub-buckets' worth at 64 each).
 */
export function filterBlocksFor(expectedMarkers: number, filterBits: number): number {
  return Math.max(64, Math.ceil((Math.max(1, expectedMarkers) * 2 * filterBits) / 32));
}

/** A digest's filter block and its bits in the block (marker_buckets.lua blockOf, bitsOf), for tools that lay markers out. */
export function filterSlotOf(digest: Uint8Array, blocks: number): { block: number; bits: number } {
  const block = (((digest[4]! << 24) | (digest[5]! << 16) | (digest[6]! << 8) | digest[7]!) >>> 0) % blocks;
  const bits = ((1 << (digest[8]! % 32)) | (1 << (digest[9]! % 32)) | (1 << (digest[10]! % 32)) | (1 << (digest[11]! % 32))) >>> 0;
  return { block, bits };
}

/** What a prefix laid out before `marker_format` was recorded used: one `SET … EX` key per marker. */
export const LEGACY_MARKER_FORMAT = 'key-per-marker';

export const MARKER_DIGEST_BYTES = 16;

/** The value of a marker whose part is counted (two-step: occupied; atomic: written with its counts). */
export const DONE_VALUE = '1';

/** The 16-byte digest of a message id: the field of its markers. */
export function markerDigest(id: string): Buffer {
  return hash('sha256', id, 'buffer').subarray(0, MARKER_DIGEST_BYTES);
}

/**
 * The same digest as a `binary` (latin1) string, char i being byte i: its
 * first MARKER_DIGEST_BYTES chars are markerDigest's bytes (the rest of the
 * SHA-256 follows and is never read). The coordinator's form: one string per
 * delivery instead of a Buffer and its subarray view, about 0.5 µs and
 * 0.3 KB of garbage less per delivery on the main thread (microbench: 0.95
 * against 0.35–0.45 µs per id). It crosses to the threads as bytes
 * (batch-protocol.ts).
 */
export type DigestText = string;

export function markerDigestText(id: string): DigestText {
  return hash('sha256', id, 'binary');
}

/** The digests of a batch task's parts: the coordinator's, or computed from the ids (tests build tasks without them). */
export function taskDigests(task: { readonly digests?: readonly Uint8Array[]; readonly ids?: readonly string[] }): readonly Uint8Array[] {
  if (task.digests !== undefined) return task.digests;
  if (task.ids === undefined) throw new TypeError('a batch task needs digests or ids');
  return task.ids.map(markerDigest);
}

/** Which sub-bucket a digest falls in: its first two bytes, big-endian, modulo a power of two. */
export function subBucketOf(digest: Uint8Array, subBuckets: number): number {
  return ((digest[0]! << 8) | digest[1]!) & (subBuckets - 1);
}

export function isPowerOfTwo(n: number): boolean {
  return Number.isInteger(n) && n >= 1 && (n & (n - 1)) === 0;
}

/** Markers per hash a new bucket is sized for: half the listpack limit, so a rate that doubles within a bucket still fits. */
export const MARKERS_PER_SUB_BUCKET = 64;
/**
 * Markers per hash a filtered bucket is sized for (message-scoped markers).
 * The filter spares the lookups, so the hashes serve the writes: with 64 per
 * hash each message's marker landed in a hash of its own, one HSET per
 * message; with 16,384 a batch of 500 messages falls into a few dozen
 * hashes. They are hashtables past 128 fields (about 70 bytes per marker
 * against 23), which one marker per message affords, and one frees in
 * about a millisecond when it expires.
 */
export const FILTERED_MARKERS_PER_SUB_BUCKET = 16_384;

/** Markers per hash for a bucket with or without a filter (marker_buckets.lua openBucket). */
export function markersPerSubBucket(filterBits: number): number {
  return filterBits > 0 ? FILTERED_MARKERS_PER_SUB_BUCKET : MARKERS_PER_SUB_BUCKET;
}
export const MAX_SUB_BUCKETS = 65_536;

/**
 * A new bucket's sub-bucket count, as the scripts choose it: enough hashes
 * for the markers the bucket before received at MARKERS_PER_SUB_BUCKET each,
 * or `initial` when that bucket is unknown (the first of a shard, or after an
 * idle spell longer than its life).
 */
export function subBucketsAfter(previousMarkers: number | null, initial: number, perHash: number = MARKERS_PER_SUB_BUCKET): number {
  if (previousMarkers === null) return initial;
  let subs = 1;
  while (subs < MAX_SUB_BUCKETS && subs * perHash < previousMarkers) subs *= 2;
  return subs;
}

/** The bucket a time (seconds) falls in. */
export function bucketOf(nowS: number, widthS: number): number {
  return Math.floor(nowS / widthS);
}

/** When (epoch seconds) a bucket's hashes expire: its end plus the marker TTL. */
export function bucketExpiresAt(bucket: number, widthS: number, ttlS: number): number {
  return (bucket + 1) * widthS + ttlS;
}

/** The oldest bucket still live at `nowS`: the first whose expiry is after now. */
export function oldestLiveBucket(nowS: number, widthS: number, ttlS: number): number {
  return Math.floor((nowS - ttlS) / widthS);
}

/** Buckets a pre-check reads at most: ceil(ttl / width) + 1. */
export function bucketsToCheck(widthS: number, ttlS: number): number {
  return Math.ceil(ttlS / widthS) + 1;
}

/**
 * The bucket width a new prefix records: half the marker TTL, so a
 * pre-check reads at most 3 buckets and a marker lives 1.0 to 1.5 TTL
 * (1.25 on average).
 */
export function defaultBucketWidthS(markerTtlS: number): number {
  return Math.max(1, Math.ceil(markerTtlS / 2));
}

/** The marker hash a digest goes to in a bucket. */
export function markerBucketKey(prefix: string, vshard: number, bucket: number, sub: number): string {
  return `${prefix}mk:{${vshard}}:${bucket}:${sub}`;
}

/** A bucket's meta hash: `s` its sub-bucket count, `n` the markers written to it. */
export function markerMetaKey(prefix: string, vshard: number, bucket: number): string {
  return `${prefix}mk:{${vshard}}:${bucket}:m`;
}

/** What the scripts get as their marker key: they append `:<bucket>:<sub>` themselves (same hash tag, same slot). */
export function markerBaseKey(prefix: string, vshard: number): string {
  return `${prefix}mk:{${vshard}}`;
}

/** A marker hash key's parts, or null if the key is not one. */
export function parseMarkerBucketKey(prefix: string, key: string): { vshard: number; bucket: number; sub: number } | null {
  const head = `${prefix}mk:{`;
  if (!key.startsWith(head)) return null;
  const match = /^(\d+)\}:(-?\d+):(\d+)$/.exec(key.slice(head.length));
  if (match === null) return null;
  return { vshard: Number(match[1]), bucket: Number(match[2]), sub: Number(match[3]) };
}

/**
 * A claim: "daemon <token> took this part at <ms> (server clock) and has not
 * finished it". Two-step mode only. A claim older than the claim TTL belongs
 * to a daemon that died or stalled, and is taken over.
 */
export function claimValue(token: string, atMs: number): string {
  return `c${token}:${atMs}`;
}

/** A claim's holder and time, or null when the value is not a claim (a done marker). */
export function parseClaim(value: string): { token: string; atMs: number } | null {
  const match = /^c([0-9a-f]+):(\d+)$/.exec(value);
  return match === null ? null : { token: match[1]!, atMs: Number(match[2]) };
}

/** Per part, what a batch found: a BatchResult's `marked` (batch-protocol.ts). */
export const PART_NEW = 0;
export const PART_DONE = 1;
/** Another daemon's live claim holds it: leave it for later, count nothing now. */
export const PART_HELD = 2;
/**
 * Stream mode: not applied, because its partition's watermark on the shard
 * was found below the one the coordinator expected (Redis lost acknowledged
 * writes); the partition is replayed from the log, this part with it.
 */
export const PART_REWIND = 3;

/**
 * Each script's per-part flag characters (script-replies.ts), as the one set
 * of part states a BatchResult carries (PART_*): the one place the scripts'
 * characters meet TypeScript's names. A part atomic_batch.lua refused is
 * PART_NEW, like a counted one: its refusal travels in the refusals.
 */
const FLAG_STATES: Readonly<Record<'claim' | 'atomic', ReadonlyMap<string, number>>> = Object.freeze({
  claim: new Map([
    [ScriptReply.CLAIM_NEW, PART_NEW],
    [ScriptReply.CLAIM_DONE, PART_DONE],
    [ScriptReply.CLAIM_HELD, PART_HELD],
  ]),
  atomic: new Map([
    [ScriptReply.ATOMIC_COUNTED, PART_NEW],
    [ScriptReply.ATOMIC_DUPLICATE, PART_DONE],
    [ScriptReply.ATOMIC_REFUSED, PART_NEW],
  ]),
});

/** A script's flags string (claim_markers.lua by default, or atomic_batch.lua), one character per part, as one part state (PART_*) per part. */
export function parsePartFlags(flags: string, parts: number, script: 'claim' | 'atomic' = 'claim'): Uint8Array {
  if (flags.length !== parts) throw new Error(`a batch script returned ${flags.length} flags for ${parts} parts`);
  const states = FLAG_STATES[script];
  const out = new Uint8Array(parts);
  for (let i = 0; i < parts; i++) {
    const state = states.get(flags[i]!);
    if (state === undefined) throw new Error(`a batch script returned the flag ${flags[i]} at part ${i}`);
    out[i] = state;
  }
  return out;
}
