/**
 * The committed checkpoints of a prefix's stream partitions, in one hash
 * (<prefix>checkpoints, a field per partition; checkpoint-record.ts says
 * what a record holds). Written by a partition's owner about once a second
 * (TALLY_STREAM_CHECKPOINT_MS) and at a handover; read when a daemon
 * resumes a partition, by `tally status` and by `tally stream reset`.
 *
 * Two rules, kept by the scripts so that two daemons overlapping on a
 * partition (a handover, on purpose in a test) cannot break them:
 * - a commit never moves a checkpoint back: a daemon behind the other one
 *   writes nothing (its own reads are replays the watermarks skip);
 * - a rewind (a rollback found: replay from an earlier offset) moves it back
 *   and counts itself in `rewinds`; a commit made under an older count is
 *   refused, and its daemon resumes from the rewound checkpoint too.
 */
import { checkpointKey } from '@tally/shared';
import type { RedisClient } from '@tally/runtime';
import { decodeCheckpoint, encodeCheckpoint, type CheckpointRecord } from './checkpoint-record.js';

/**
 * KEYS[1] the checkpoints hash; ARGV[1] the partition; ARGV[2] the rewinds
 * the writer resumed under; ARGV[3] the record; ARGV[4] its offset.
 * Returns 1 written, 0 not (the checkpoint is already further), -1 refused
 * (a rewind the writer has not seen), with the record found.
 */
const COMMIT_LUA = `
local found = redis.call('HGET', KEYS[1], ARGV[1])
if found then
  local ok, record = pcall(cjson.decode, found)
  if ok and type(record) == 'table' then
    if tonumber(record.rewinds) ~= tonumber(ARGV[2]) then return {-1, found} end
    if tonumber(record.offset) ~= nil and tonumber(record.offset) >= tonumber(ARGV[4]) then return {0, found} end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return {1, ARGV[3]}
`;

/**
 * KEYS[1] the checkpoints hash; ARGV[1] the partition; ARGV[2] the offset to
 * replay after (the watermark found). The checkpoint becomes at most that
 * offset, its rewinds one more, its body unknown (''): no identity to check
 * at an offset no checkpoint was taken at. Returns the new rewinds count.
 */
const REWIND_LUA = `
local found = redis.call('HGET', KEYS[1], ARGV[1])
local rewinds = 0
local offset = tonumber(ARGV[2])
local at = ARGV[3]
local known = {}
if found then
  local ok, record = pcall(cjson.decode, found)
  if ok and type(record) == 'table' then
    rewinds = tonumber(record.rewinds) or 0
    local current = tonumber(record.offset)
    if current ~= nil and current < offset then offset = current end
    if type(record.known) == 'table' then known = record.known end
  end
end
rewinds = rewinds + 1
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({offset = string.format('%d', offset), body = '', at = tonumber(at), known = known, rewinds = rewinds}))
return rewinds
`;

export type CommitOutcome =
  | { readonly outcome: 'written' }
  | { readonly outcome: 'behind'; readonly found: CheckpointRecord | null }
  | { readonly outcome: 'rewound'; readonly found: CheckpointRecord | null };

export class CheckpointStore {
  private readonly key: string;

  constructor(
    private readonly redis: RedisClient,
    prefix: string,
  ) {
    this.key = checkpointKey(prefix);
  }

  /** The partition's checkpoint; null when none was committed (or the field holds something that is not one). */
  async read(partition: number): Promise<CheckpointRecord | null> {
    const raw = await this.redis.hget(this.key, String(partition));
    return raw === null ? null : decodeCheckpoint(raw);
  }

  /** Every partition's checkpoint (tally status). */
  async readAll(): Promise<Map<number, CheckpointRecord>> {
    const all = await this.redis.hgetall(this.key);
    const out = new Map<number, CheckpointRecord>();
    for (const [field, raw] of Object.entries(all)) {
      const record = decodeCheckpoint(raw);
      if (record !== null && /^\d+$/.test(field)) out.set(Number(field), record);
    }
    return out;
  }

  async commit(partition: number, record: CheckpointRecord): Promise<CommitOutcome> {
    const [code, raw] = (await this.redis.eval(
      COMMIT_LUA,
      1,
      this.key,
      String(partition),
      String(record.rewinds),
      encodeCheckpoint(record),
      String(record.offset),
    )) as [number, string];
    if (code === 1) return { outcome: 'written' };
    return { outcome: code === 0 ? 'behind' : 'rewound', found: decodeCheckpoint(raw) };
  }

  /** Moves the checkpoint back to at most `offset` (-1: the stream's start) and counts the rewind; returns the new rewinds count. */
  async rewind(partition: number, offset: number): Promise<number> {
    return (await this.redis.eval(REWIND_LUA, 1, this.key, String(partition), String(offset), String(Date.now()))) as number;
  }

  /** Forgets the partition's checkpoint: its next owner starts the stream from its first message (tally stream reset). */
  async reset(partition: number): Promise<boolean> {
    return (await this.redis.hdel(this.key, String(partition))) === 1;
  }
}
