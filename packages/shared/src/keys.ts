/**
 * The Redis key names. What each key holds, its TTL, and why every key of a
 * virtual shard carries the hash tag `{<vshard>}` are described once, in
 * docs/architecture.md ("Redis keys").
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

/**
 * Counts a refused message left standing on other count shards (Redis
 * refused their undo), by the message's marker digest in hex: count key ->
 * delta. `tally dead replay` reads it to keep the message back even when
 * its dead letter lost the header that names them.
 */
export function standingKey(prefix: string, digestHex: string): string {
  return `${prefix}standing:${digestHex}`;
}

/** Stream mode: a virtual shard's watermarks, one field per partition (stream-positions.ts), in the slot of the shard's counts. */
export function watermarkKey(prefix: string, vshard: number): string {
  return `${prefix}wm:{${vshard}}`;
}

/** Stream mode: the committed checkpoint of every partition, one field per partition (a JSON record). */
export function checkpointKey(prefix: string): string {
  return `${prefix}checkpoints`;
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
