/**
 * Virtual shards: the unit of identity for counts and markers.
 *
 * A SKU's virtual shard depends only on the SKU and the number of virtual
 * shards, never on the number of threads or daemons, so a redelivery after a
 * restart with other settings finds its markers where it left them
 * (invariant 3). Threads own virtual shards (`vshard % workers`), daemons
 * share them through RabbitMQ's round-robin of whole messages.
 */
import type { Change } from './message.js';

export const SHARD_HASH = 'fnv1a32-utf8' as const;

/** FNV-1a 32-bit over the UTF-8 bytes of the SKU. Portable: any language gets the same shard. */
export function fnv1a32(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    let code = text.charCodeAt(i);
    if (code < 0x80) {
      hash = Math.imul(hash ^ code, 0x01000193);
      continue;
    }
    // Non-ASCII: hash the UTF-8 encoding so the result matches other languages.
    if (code >= 0xd800 && code <= 0xdfff) {
      const low = code <= 0xdbff && i + 1 < text.length ? text.charCodeAt(i + 1) : 0;
      if (low >= 0xdc00 && low <= 0xdfff) {
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        i++;
      } else {
        code = 0xfffd; // lone surrogate: encoded as U+FFFD, as Buffer.from does
      }
    }
    const bytes =
      code < 0x800
        ? [0xc0 | (code >> 6), 0x80 | (code & 0x3f)]
        : code < 0x10000
          ? [0xe0 | (code >> 12), 0x80 | ((code >> 6) & 0x3f), 0x80 | (code & 0x3f)]
          : [0xf0 | (code >> 18), 0x80 | ((code >> 12) & 0x3f), 0x80 | ((code >> 6) & 0x3f), 0x80 | (code & 0x3f)];
    for (const byte of bytes) hash = Math.imul(hash ^ byte, 0x01000193);
  }
  return hash >>> 0;
}

export function shardOf(sku: string, virtualShards: number): number {
  return fnv1a32(sku) % virtualShards;
}

/** The thread that owns a virtual shard. */
export function ownerOf(vshard: number, workers: number): number {
  return vshard % workers;
}

/** One message's changes bound for one virtual shard: `[sku, delta]` pairs, SKUs unique. */
export type PartChanges = Array<[sku: string, delta: number]>;

/**
 * Up to this many changes, a repeated SKU is found by scanning the entries
 * made so far: for the usual 1 to 16 changes that is cheaper than building
 * a Map per message on the coordinator's main thread. Past it, a Map keeps a
 * message of thousands of changes linear.
 */
const SCAN_LIMIT = 32;

/**
 * A message's parts, by index: part i is `parts[i]`, bound for virtual
 * shard `shards[i]`, for i below `size`. One is reused for every delivery
 * (the intake hands the parts to the lanes at once): a Map per message, the
 * entry array its iteration made per part and the scan array cost the main
 * thread about 0.6 KB of garbage per delivery (docs/benchmark.md).
 */
export class ShardSplit {
  readonly shards: number[] = [];
  readonly parts: PartChanges[] = [];
  size = 0;
  /** The entries made so far for the message being split (scanned for repeated SKUs). */
  readonly made: Array<[string, number]> = [];

  /** The split as a Map, vshard to part (tests and tools). */
  toMap(): Map<number, PartChanges> {
    const map = new Map<number, PartChanges>();
    for (let i = 0; i < this.size; i++) map.set(this.shards[i]!, this.parts[i]!);
    return map;
  }
}

/**
 * Filters a message's changes (zero deltas, unaccepted types) and splits the
 * rest by virtual shard, summing repeated SKUs. A SKU whose deltas cancel out
 * inside the message stays in its part with delta 0: the part still exists,
 * so its marker is still occupied and a redelivery is still recognised.
 */
export function splitByShard(changes: readonly Change[], virtualShards: number, acceptTypes: ReadonlySet<string> | null): Map<number, PartChanges> {
  return splitInto(new ShardSplit(), changes, virtualShards, acceptTypes).toMap();
}

/** splitByShard into a reused ShardSplit (emptied first), in the order each part's first SKU comes. */
export function splitInto(split: ShardSplit, changes: readonly Change[], virtualShards: number, acceptTypes: ReadonlySet<string> | null): ShardSplit {
  const { shards, parts, made } = split;
  split.size = 0;
  const index = changes.length > SCAN_LIMIT ? new Map<string, [string, number]>() : null;
  let madeCount = 0;
  for (const change of changes) {
    if (change.delta === 0) continue;
    if (acceptTypes !== null && (change.type === undefined || !acceptTypes.has(change.type))) continue;
    const { sku } = change;
    let existing: [string, number] | undefined;
    if (index !== null) existing = index.get(sku);
    else
      for (let j = 0; j < madeCount; j++)
        if (made[j]![0] === sku) {
          existing = made[j];
          break;
        }
    if (existing) {
      // parseMessage bounds the sum of |delta| per SKU, so any subset of a
      // SKU's changes (after filtering) sums safely.
      existing[1] += change.delta;
      continue;
    }
    const entry: [string, number] = [sku, change.delta];
    if (index !== null) index.set(sku, entry);
    else made[madeCount++] = entry;
    const vshard = virtualShards === 1 ? 0 : shardOf(sku, virtualShards);
    // A message has a few parts: a scan is cheaper than any map.
    let at = 0;
    while (at < split.size && shards[at] !== vshard) at++;
    // A literal of one: most parts hold one SKU, and `[]` would grow to 17 slots on its first push.
    if (at === split.size) {
      shards[at] = vshard;
      parts[at] = [entry];
      split.size++;
    } else parts[at]!.push(entry);
  }
  // Nothing of this message stays reachable from the scratch arrays past the next split.
  made.fill(undefined as never, 0, madeCount);
  return split;
}

/**
 * Message-scoped markers: a message's changes, filtered and summed per SKU
 * as splitByShard does, as one part on its marker shard (markers.ts
 * markerShardOf). Empty when no change is left.
 */
export function wholeMessagePart(changes: readonly Change[], markerShard: number, acceptTypes: ReadonlySet<string> | null): Map<number, PartChanges> {
  return wholeMessageInto(new ShardSplit(), changes, markerShard, acceptTypes).toMap();
}

/** wholeMessagePart into a reused ShardSplit. */
export function wholeMessageInto(split: ShardSplit, changes: readonly Change[], markerShard: number, acceptTypes: ReadonlySet<string> | null): ShardSplit {
  splitInto(split, changes, 1, acceptTypes);
  if (split.size === 1) split.shards[0] = markerShard;
  return split;
}
