/**
 * The Redis key layout. Every key of a virtual shard carries the hash tag
 * `{<vshard>}`, so on Redis Cluster a shard's counts, markers and receipts
 * share one slot: pipelines stay single-slot and a server-side script (the
 * atomic mode) can touch them all.
 *
 *   <prefix>c:{<vshard>}:<sku>        count (integer, TTL TALLY_COUNT_TTL_S + refresh interval, refreshed once per interval: worker count-ttl.ts)
 *   <prefix>mk:{<vshard>}:<bucket>:<sub>
 *                                     markers: a small hash (listpack) whose fields are the 16-byte
 *                                     digests of message ids, value '1' (this message's part for this
 *                                     shard is counted) or, in two-step mode, the number of the batch
 *                                     that claimed it (done once the batch's record is '1'). <bucket> = server time / bucket
 *                                     width, <sub> = digest bits; the hash expires at the bucket's end
 *                                     plus TALLY_MARKER_TTL_S (see markers.ts)
 *   <prefix>mk:{<vshard>}:<bucket>:m  the bucket's meta hash: s = its sub-bucket count, n = markers written,
 *                                     x = which hashes carry their expiry, b = the last batch number,
 *                                     b<number> = a two-step batch's claim 'c<token>:<ms>', then '1'
 *   <prefix>w:{<vshard>}:<batch id>   write receipt: this batch's counts landed (TTL TALLY_MARKER_TTL_S)
 *   <prefix>stats                     hash of accumulated counters
 *   <prefix>layout                    hash: virtual shard count, hash function, mode, marker format
 *                                     (marker_format, marker_bucket_s, marker_sub_buckets), and one
 *                                     `lease:<daemon id>` field per live daemon (its mode and lease expiry)
 *   <prefix>m:{<vshard>}:<id>         the marker format before `marker_format` was recorded: one
 *                                     `SET … EX` key per marker. No longer written; a start refuses a
 *                                     prefix while any is live (layout-guard.ts)
 *   <prefix>daemon:<host>:<pid>:<rnd>  heartbeat of one daemon: JSON (host, pid, mode, version, consuming,
 *                                     oldest unacked age, ...), TTL a few heartbeat intervals, deleted on a clean stop
 *
 * The heartbeat keys carry no hash tag: each lands in its own slot, so on a
 * cluster listing them means scanning every master (see heartbeat.ts).
 */

export function countKey(prefix: string, vshard: number, sku: string): string {
  return `${prefix}c:{${vshard}}:${sku}`;
}

/** A marker of the legacy key-per-marker format; no longer written, only looked for (layout-guard.ts). */
export function legacyMarkerKey(prefix: string, vshard: number, id: string): string {
  return `${prefix}m:{${vshard}}:${id}`;
}

export function receiptKey(prefix: string, vshard: number, batchId: string): string {
  return `${prefix}w:{${vshard}}:${batchId}`;
}

export function statsKey(prefix: string): string {
  return `${prefix}stats`;
}

export function layoutKey(prefix: string): string {
  return `${prefix}layout`;
}

/** `daemonId` is `<host>:<pid>:<random>`; see heartbeat.ts. */
export function daemonKey(prefix: string, daemonId: string): string {
  return `${prefix}daemon:${daemonId}`;
}

/** Escapes Redis glob metacharacters so a prefix matches only itself. */
export function escapeGlob(text: string): string {
  return text.replace(/[*?[\]\\]/g, (c) => `\\${c}`);
}

export function countScanPattern(prefix: string): string {
  return `${escapeGlob(prefix)}c:{*}:*`;
}

export function daemonScanPattern(prefix: string): string {
  return `${escapeGlob(prefix)}daemon:*`;
}

/** Every marker hash of the prefix (markers.ts). */
export function markerScanPattern(prefix: string): string {
  return `${escapeGlob(prefix)}mk:{*}:*`;
}

/** Every marker key of the legacy key-per-marker format. */
export function legacyMarkerScanPattern(prefix: string): string {
  return `${escapeGlob(prefix)}m:{*}:*`;
}

/** The SKU inside a count key, or null if the key is not one. */
export function skuOfCountKey(prefix: string, key: string): string | null {
  const head = `${prefix}c:{`;
  if (!key.startsWith(head)) return null;
  const close = key.indexOf('}:', head.length);
  if (close < 0) return null;
  const vshard = key.slice(head.length, close);
  if (!/^\d+$/.test(vshard)) return null;
  return key.slice(close + 2);
}
