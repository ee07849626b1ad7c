/**
 * Pure: the marker population a prefix holds in steady state, laid out as
 * the daemon lays it out (packages/shared/src/markers.ts,
 * packages/worker/src/lua/include/marker_buckets.lua):
 *
 * - every live bucket (the oldest whose hashes have not expired, up to the
 *   bucket of now: ceil(TTL / width) + 1 of them, 3 at the default width of
 *   half the TTL) holds, per virtual shard, the markers that arrived during
 *   it: rate × that shard's parts per message × bucket width, the bucket of
 *   now only up to the fraction of it that has elapsed;
 * - each shard's bucket has as many sub-bucket hashes as openBucket gives it
 *   from the markers of the bucket before (subBucketsAfter): in steady state
 *   that one was full when this one opened, so every live bucket is sized
 *   from a full bucket, the one of now included;
 * - the markers of a shard's bucket fall into its hashes by the first two
 *   bytes of their digests, uniformly: a multinomial draw (subBucketCounts).
 *
 * The fill (marker-fill.ts) writes what this computes; tests check both
 * against the daemon's own scripts.
 */
import { bucketExpiresAt, bucketOf, oldestLiveBucket, splitByShard, subBucketsAfter, type Change } from '@tally/shared';

export interface PopulationInput {
  /** Messages per second the population is that of (distinct messages: duplicates add no marker). */
  readonly rate: number;
  readonly markerTtlS: number;
  /** The prefix's bucket width (its layout's marker_bucket_s). */
  readonly bucketWidthS: number;
  /** Per virtual shard, the parts a message has on it on average (their sum: parts per message). */
  readonly partsPerMessageByShard: readonly number[];
  /** The server's clock, seconds (fractional). */
  readonly nowS: number;
  /** Markers per hash a bucket is sized for (markersPerSubBucket: 64, or far more for a filtered bucket). */
  readonly markersPerHash?: number;
  /** How full the bucket of now is, 0 ≤ f < 1, instead of its elapsed fraction at `nowS` (--steady-phase). */
  readonly currentFraction?: number | null;
}

export interface BucketPopulation {
  readonly vshard: number;
  readonly bucket: number;
  /** Markers this shard's bucket holds. */
  readonly markers: number;
  /** Its sub-bucket hashes (openBucket's rule, from a full bucket before it). */
  readonly subBuckets: number;
  /** Epoch seconds at which its hashes expire (EXPIREAT). */
  readonly expiresAt: number;
  /** The markers the bucket before it received, which openBucket sized it (and its filter) for. */
  readonly sizedFor: number;
}

export interface Population {
  readonly currentBucket: number;
  readonly oldestBucket: number;
  /** Elapsed fraction of the bucket of now, 0 ≤ f < 1: how full it is. */
  readonly currentFraction: number;
  /** Markers a full bucket holds per shard. */
  readonly fullBucketMarkers: readonly number[];
  readonly partsPerMessage: number;
  /** Every (shard, live bucket), oldest bucket first, shards in order. */
  readonly buckets: readonly BucketPopulation[];
  readonly totalMarkers: number;
}

export function steadyPopulation(input: PopulationInput): Population {
  const { rate, markerTtlS, bucketWidthS: width, partsPerMessageByShard: shares, nowS } = input;
  if (!(rate >= 0) || !(width >= 1) || !(markerTtlS >= 1)) throw new RangeError('rate ≥ 0, bucket width ≥ 1 s and marker TTL ≥ 1 s');
  const current = bucketOf(nowS, width);
  // The scripts compute the oldest bucket from whole seconds (TIME's seconds).
  const oldest = oldestLiveBucket(Math.floor(nowS), width, markerTtlS);
  const fraction = input.currentFraction ?? (nowS - current * width) / width;
  const full = shares.map((share) => Math.round(rate * share * width));
  const buckets: BucketPopulation[] = [];
  let total = 0;
  for (let bucket = oldest; bucket <= current; bucket++) {
    for (let vshard = 0; vshard < shares.length; vshard++) {
      const markers = bucket === current ? Math.round(full[vshard]! * fraction) : full[vshard]!;
      // Every bucket was opened while the bucket before it was full (steady state); a shard with no parts has no marker anywhere.
      if (full[vshard] === 0) continue;
      buckets.push({
        vshard,
        bucket,
        markers,
        subBuckets: subBucketsAfter(full[vshard]!, 1, input.markersPerHash),
        expiresAt: bucketExpiresAt(bucket, width, markerTtlS),
        sizedFor: full[vshard]!,
      });
      total += markers;
    }
  }
  return {
    currentBucket: current,
    oldestBucket: oldest,
    currentFraction: fraction,
    fullBucketMarkers: full,
    partsPerMessage: shares.reduce((a, b) => a + b, 0),
    buckets,
    totalMarkers: total,
  };
}

/** Per virtual shard, the parts per message of a set of messages' changes (what each message adds to each shard's markers). */
export function partsPerMessageByShard(messages: Iterable<readonly Change[]>, virtualShards: number): number[] {
  const parts = new Array<number>(virtualShards).fill(0);
  let count = 0;
  for (const changes of messages) {
    count++;
    for (const vshard of splitByShard(changes, virtualShards, null).keys()) parts[vshard]!++;
  }
  return count === 0 ? parts : parts.map((p) => p / count);
}

/** Uniform shares: `partsPerMessage` spread evenly over the shards. */
export function evenShares(partsPerMessage: number, virtualShards: number): number[] {
  return new Array<number>(virtualShards).fill(partsPerMessage / virtualShards);
}

/**
 * How many of a bucket's markers fall in each of its hashes: each marker's
 * sub-bucket drawn uniformly, as the first two bytes of a SHA-256 digest
 * fall. Sums to `markers` exactly.
 */
export function subBucketCounts(markers: number, subBuckets: number, random: () => number): Uint32Array {
  const counts = new Uint32Array(subBuckets);
  for (let i = 0; i < markers; i++) counts[Math.floor(random() * subBuckets)]!++;
  return counts;
}

/**
 * The meta field `x`: which hashes of the bucket carry their expiry, one bit
 * per sub-bucket (byte sub >> 3, bit sub & 7, least significant first), as
 * marker_buckets.lua's `expiring` keeps it. A hash exists, and carries its
 * expiry, exactly when it holds a marker. Trailing zero bytes are left off,
 * as the script never writes past the highest hash it created.
 */
export function expiryBitmap(counts: Uint32Array): Buffer {
  let last = -1;
  for (let sub = counts.length - 1; sub >= 0; sub--) {
    if (counts[sub]! > 0) {
      last = sub;
      break;
    }
  }
  const bitmap = Buffer.alloc(last < 0 ? 0 : (last >> 3) + 1);
  for (let sub = 0; sub <= last; sub++) if (counts[sub]! > 0) bitmap[sub >> 3]! |= 1 << (sub & 7);
  return bitmap;
}
