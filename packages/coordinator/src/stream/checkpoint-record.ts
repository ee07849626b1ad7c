/**
 * A partition's committed checkpoint, as kept in <prefix>checkpoints (one
 * field per partition): the offset up to which every message of the
 * partition is applied on every shard (or skipped, or dead-lettered), and
 * what a daemon resuming from it checks and trusts.
 *
 * - `offset`: the last message of the committed run (the multiple-ack's);
 *   a resume reads from it, so the first delivery must be that very message:
 * - `body`: the SHA-256 (hex, 16 bytes) of that message's body. Another body
 *   at that offset means the stream was deleted and recreated: refused.
 * - `at`: when it was committed (epoch ms): the id window is rebuilt from
 *   `at` minus its TTL.
 * - `known`: per virtual shard, the watermark the committing daemon had seen
 *   (-1 none). A resume expects at least these: one found below means Redis
 *   lost acknowledged writes (invariant 18).
 * - `rewinds`: how many times the partition was rewound; a commit made
 *   under an older count is refused, so a daemon that missed a rewind cannot
 *   move the checkpoint past the range being replayed.
 *
 * Offsets travel as decimal strings: JSON numbers survive, but Lua's cjson
 * prints numbers with 14 significant digits.
 */
export interface CheckpointRecord {
  readonly offset: number;
  readonly body: string;
  readonly at: number;
  readonly known: readonly number[];
  readonly rewinds: number;
}

export function encodeCheckpoint(record: CheckpointRecord): string {
  return JSON.stringify({
    offset: String(record.offset),
    body: record.body,
    at: record.at,
    known: record.known.map(String),
    rewinds: record.rewinds,
  });
}

/** The record, or null when the field holds something else (a foreign write): treated as no checkpoint, and logged by the caller. */
export function decodeCheckpoint(raw: string): CheckpointRecord | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    return null;
  }
  const value = parsed as { offset?: unknown; body?: unknown; at?: unknown; known?: unknown; rewinds?: unknown } | null;
  if (value === null || typeof value !== 'object') return null;
  const offset = integerOf(value.offset);
  const rewinds = integerOf(value.rewinds);
  const at = integerOf(value.at);
  // Lua's cjson writes an empty table as {}: an empty list of watermarks.
  const list = isEmptyObject(value.known) ? [] : value.known;
  if (offset === null || rewinds === null || at === null || typeof value.body !== 'string' || !Array.isArray(list)) return null;
  const known: number[] = [];
  for (const entry of list) {
    const watermark = integerOf(entry);
    if (watermark === null) return null;
    known.push(watermark);
  }
  return { offset, body: value.body, at, known, rewinds };
}

function integerOf(value: unknown): number | null {
  const number = typeof value === 'string' && /^-?\d+$/.test(value) ? Number(value) : value;
  return typeof number === 'number' && Number.isSafeInteger(number) ? number : null;
}

function isEmptyObject(value: unknown): boolean {
  return typeof value === 'object' && value !== null && !Array.isArray(value) && Object.keys(value).length === 0;
}
