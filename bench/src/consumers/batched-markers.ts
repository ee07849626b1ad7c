/**
 * The hand-written batched consumer's marker keys (consumers/batched.ts),
 * shared with the fill of its steady-state population (batched-fill.ts):
 * `<prefix>m:<id>` on one Redis; on a cluster `<prefix>m:{m<tag>}:<id>`, the
 * tag a hash of the id, so that one MGET per tag stays in one slot.
 */

/** Hash tags the markers spread over on a cluster: per-tag MGETs of about a batch / MARKER_TAGS keys, spread over the masters. */
export const MARKER_TAGS = 16;

/** FNV-1a of the id, modulo MARKER_TAGS. */
export function markerTagOf(id: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < id.length; i++) hash = Math.imul(hash ^ id.charCodeAt(i), 0x01000193);
  return (hash >>> 0) % MARKER_TAGS;
}

/** What every marker key of a tag starts with (tag null: one Redis, no tags). */
export function markerStem(prefix: string, tag: number | null): string {
  return tag === null ? `${prefix}m:` : `${prefix}m:{m${tag}}:`;
}
