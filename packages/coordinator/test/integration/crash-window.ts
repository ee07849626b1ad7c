/**
 * What a SIGKILL left in its crash window (two-step mode: counts written,
 * markers not yet), measured from Redis while no daemon runs. Lets a crash
 * test bound each kill by what it really had in flight, not by the most it
 * could have had.
 */
import type { Redis } from 'ioredis';
import { DEFAULTS, markerDigest, parseMessage, shardOf, splitByShard, type PartChanges } from '@tally/shared';
import { markersDone, readMarkers } from '@tally/testkit';
import type { Publish } from '@tally/workload';
import { readCounts } from '../../src/commands/counts.js';

export type PartsById = ReadonlyMap<string, ReadonlyMap<number, PartChanges>>;

/** Each good message's changes per virtual shard, as the daemon splits them: what its marker on that shard stands for. */
export function partsById(publishes: readonly Publish[], virtualShards: number): PartsById {
  const parts = new Map<string, Map<number, PartChanges>>();
  for (const publish of publishes) {
    if (publish.kind !== 'good') continue;
    const parsed = parseMessage(publish.body, publish.messageId, { maxBytes: 1 << 20 });
    if (!parsed.ok) throw new Error(`a good publish does not parse: ${parsed.reason}`);
    parts.set(parsed.message.id, splitByShard(parsed.message.changes, virtualShards, null));
  }
  return parts;
}

/**
 * Units written but not accounted for by a marker, per virtual shard: the
 * counts minus what the occupied markers stand for. Taken while no daemon
 * runs (right after a SIGKILL), it is the overcount so far plus the crash
 * window the victim left open (counts written, markers not), so its growth
 * from one kill to the next is exactly what that kill had in its window.
 * Meaningful for positive deltas only (a negative delta would hide a window).
 */
export async function unmarkedUnitsPerShard(redis: Redis, prefix: string, virtualShards: number, parts: PartsById): Promise<number[]> {
  const counts = await readCounts(redis, { prefix, virtualShards }, []);
  const unmarked = new Map<string, number>();
  for (const [sku, value] of counts) unmarked.set(sku, Number(value));
  const idOfDigest = new Map<string, string>();
  for (const id of parts.keys()) idOfDigest.set(markerDigest(id).toString('hex'), id);
  // Done markers only: a claim stands for nothing counted yet.
  for (const entry of (await readMarkers(redis, prefix)).done) {
    const [vshard, digest] = entry.split(':') as [string, string];
    const id = idOfDigest.get(digest);
    const part = id === undefined ? undefined : parts.get(id)?.get(Number(vshard));
    if (part === undefined) throw new Error(`marker ${entry} stands for no published part`);
    for (const [sku, delta] of part) unmarked.set(sku, (unmarked.get(sku) ?? 0) - delta);
  }
  const totals = new Array<number>(virtualShards).fill(0);
  for (const [sku, units] of unmarked) totals[shardOf(sku, virtualShards)]! += units;
  return totals;
}

/**
 * The most units one batch of shard `vshard` can hold: its `batchSize`
 * largest parts (positive deltas). "At most one batch per shard per kill"
 * as a number, from the workload itself rather than from its extremes.
 */
export function largestBatchUnits(parts: PartsById, vshard: number, batchSize: number): number {
  const sizes: number[] = [];
  for (const byShard of parts.values()) {
    const part = byShard.get(vshard);
    if (part !== undefined) sizes.push(part.reduce((sum, [, delta]) => sum + delta, 0));
  }
  sizes.sort((a, b) => b - a);
  return sizes.slice(0, batchSize).reduce((a, b) => a + b, 0);
}

/** One part of a good message, with the queue position of its first publish. */
interface LedgerPart {
  readonly position: number;
  readonly vshard: number;
  readonly digest: Buffer;
  readonly units: number;
}

/**
 * `unmarkedUnitsPerShard` for a run that measures many times (a daemon
 * frozen by SIGSTOP, dozens of times), without scanning every marker each
 * time: markers outlive the run (its TTL exceeds it), so a part found marked
 * stays marked and is not asked again, and a part is asked about only once
 * the broker can have delivered it. The queue is a classic FIFO queue
 * published in order, whose requeued deliveries keep their place: only the
 * first `published - ready` positions (the most there ever were) have been
 * delivered; `prefetch` more are asked about for safety. A crash test checks
 * it against the full scan while no daemon runs (`unmarkedUnitsPerShard`).
 */
export class UnmarkedLedger {
  private readonly parts: LedgerPart[] = [];
  private readonly skus: string[];
  private readonly shardOfSku = new Map<string, number>();
  /** Parts asked about and not marked yet. */
  private pending: LedgerPart[] = [];
  private next = 0;
  private deliveredMost = 0;
  private readonly markedUnits: number[];

  constructor(
    publishes: readonly Publish[],
    parts: PartsById,
    private readonly prefix: string,
    private readonly virtualShards: number,
    private readonly slack: number,
    private readonly markerTtlS: number = DEFAULTS.markerTtlS,
  ) {
    const seen = new Set<string>();
    publishes.forEach((publish, position) => {
      if (publish.kind !== 'good' || publish.id === undefined || seen.has(publish.id)) return;
      seen.add(publish.id);
      const digest = markerDigest(publish.id);
      for (const [vshard, part] of parts.get(publish.id) ?? []) {
        this.parts.push({ position, vshard, digest, units: part.reduce((sum, [, delta]) => sum + delta, 0) });
        for (const [sku] of part) this.shardOfSku.set(sku, vshard);
      }
    });
    this.skus = [...this.shardOfSku.keys()];
    this.markedUnits = new Array<number>(virtualShards).fill(0);
  }

  /** Units written but not covered by a marker, per shard, with `delivered` (published minus ready) as the broker reports it now. */
  async measure(redis: Redis, delivered: number): Promise<number[]> {
    this.deliveredMost = Math.max(this.deliveredMost, delivered);
    while (this.next < this.parts.length && this.parts[this.next]!.position < this.deliveredMost + this.slack) this.pending.push(this.parts[this.next++]!);
    const done = await markersDone(redis, this.prefix, this.markerTtlS, this.pending);
    const still: LedgerPart[] = [];
    this.pending.forEach((part, i) => {
      if (done[i]) this.markedUnits[part.vshard]! += part.units;
      else still.push(part);
    });
    this.pending = still;
    const counts = await readCounts(redis, { prefix: this.prefix, virtualShards: this.virtualShards }, this.skus);
    const totals = this.markedUnits.map((units) => -units);
    for (const [sku, value] of counts) totals[this.shardOfSku.get(sku)!]! += Number(value);
    return totals;
  }
}

/** The claims of a prefix right now: `<vshard>:<digest hex>` → claim record. */
export async function claimSnapshot(redis: Redis, prefix: string): Promise<ReadonlyMap<string, string>> {
  return (await readMarkers(redis, prefix)).claims;
}

/**
 * Units per shard of the parts a SIGKILLed two-step daemon left claimed and
 * unmarked, for a test whose other daemons keep running: the claims found
 * unchanged in two snapshots taken around the kill's aftermath (`before`
 * right after the kill, `after` 300 ms later). A live daemon's
 * claim turns into a done marker within its batch's milliseconds; a dead
 * one's stays until its claim TTL runs out. Every part the victim had
 * written but not marked is among them (claim, then write, then occupy), so
 * this bounds from above what the kill can add to the overcount (a claimed
 * part not written yet counts here too).
 */
export function abandonedClaimUnits(
  before: ReadonlyMap<string, string>,
  after: ReadonlyMap<string, string>,
  parts: PartsById,
  virtualShards: number,
  /** Claims an earlier kill's measure already counted (a victim's claims outlive the next kill by up to the claim TTL): skipped, and this kill's added. */
  attributed: Set<string>,
): number[] {
  const idOfDigest = new Map<string, string>();
  for (const id of parts.keys()) idOfDigest.set(markerDigest(id).toString('hex'), id);
  const totals = new Array<number>(virtualShards).fill(0);
  for (const [entry, claim] of before) {
    if (after.get(entry) !== claim || attributed.has(`${entry}=${claim}`)) continue;
    attributed.add(`${entry}=${claim}`);
    const [vshard, digest] = entry.split(':') as [string, string];
    const id = idOfDigest.get(digest);
    const part = id === undefined ? undefined : parts.get(id)?.get(Number(vshard));
    if (part === undefined) continue;
    totals[Number(vshard)]! += part.reduce((sum, [, delta]) => sum + delta, 0);
  }
  return totals;
}
