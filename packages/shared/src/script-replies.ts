/**
 * The batch scripts' return codes and per-part flags, named. The values are
 * the scripts' contract, documented in each header of
 * packages/worker/src/lua/*.lua; TypeScript compares against these names,
 * never against a bare literal, so a reader of a call site sees what the
 * script meant and a change of the contract is one edit here.
 *
 * One name per meaning: the character '2' means "held by another daemon's
 * claim" from claim_markers.lua and "refused by Redis" from
 * atomic_batch.lua, so each script's flags have their own names.
 */
export const ScriptReply = Object.freeze({
  /** claim_markers.lua, per part: new, and now claimed by this daemon. */
  CLAIM_NEW: '0',
  /** claim_markers.lua, per part: done (a duplicate: occupied, or an earlier part of the batch has its digest). */
  CLAIM_DONE: '1',
  /** claim_markers.lua, per part: another daemon's live claim holds it; counted nothing now. */
  CLAIM_HELD: '2',

  /** write_counts.lua's outcome: the counts and the receipt are written. */
  WRITE_WRITTEN: 'written',
  /** write_counts.lua's outcome: the receipt was there (a rerun); nothing written again, the first answer returned. */
  WRITE_RECEIPT: 'receipt',
  /** write_counts.lua's outcome ('sums' only): Redis refused a sum, nothing written; call again with 'parts'. */
  WRITE_ISOLATE: 'isolate',
  /** write_counts.lua's outcome: an adopter fenced this batch out of the shard (fenced adoption); nothing written, now or ever. */
  WRITE_FENCED: 'fenced',
  /** write_counts.lua, per part ('chains' only): adopted, an earlier batch of its chain counted it here; not written again. */
  WRITE_PART_ADOPTED: '2',

  /** take_back_counts.lua, per part: taken back now, under its receipt. */
  TAKE_BACK_TAKEN: 'taken',
  /** take_back_counts.lua, per part: its receipt was there (taken back before); nothing done again, that answer returned. */
  TAKE_BACK_RECEIPT: 'receipt',
  /** take_back_counts.lua, per part: its receipt key is not ours (another type, or a value no take-back writes); nothing done for it. */
  TAKE_BACK_FOREIGN: 'foreign',
  /** take_back_counts.lua, per part ('chains' only): an adopter relies on its counts here; nothing done for it. */
  TAKE_BACK_ADOPTED: 'adopted',

  /** occupy_markers.lua: the batch is done in its claims' bucket, and the clock moved on since; call again with the new parts' digests to write them there. */
  OCCUPY_NEEDS_DIGESTS: -1,
  /** occupy_markers.lua: the batch's write receipt is gone (a failover lost the counts); nothing was marked. */
  OCCUPY_RECEIPT_GONE: -2,

  /** atomic_batch.lua, per part: counted now. */
  ATOMIC_COUNTED: '0',
  /** atomic_batch.lua, per part: a duplicate (its marker was done). */
  ATOMIC_DUPLICATE: '1',
  /** atomic_batch.lua, per part: refused by Redis (listed in the refusals); counted nothing, no marker. */
  ATOMIC_REFUSED: '2',
  /** atomic_batch.lua's `replayed`: the receipt answered, the batch had already run. */
  ATOMIC_REPLAYED: 1,

  /** stream_batch.lua: every part applied, the watermarks raised (refusals listed). */
  STREAM_APPLIED: 'applied',
  /** stream_batch.lua: nothing written; the watermarks found follow (a replay, a straddle, or writes lost). */
  STREAM_FOUND: 'found',
  /** stream_batch.lua ('sums' only): Redis refused a sum, nothing written; call again with 'parts'. */
  STREAM_ISOLATE: 'isolate',
} as const);
