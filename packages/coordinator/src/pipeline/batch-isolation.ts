/**
 * A batch that fails because of its data, isolated.
 *
 * The scripts isolate a refused increment themselves, part by part. A `data`
 * failure of the whole batch is what is left: a reply classified `data` that
 * no part-by-part script handled (a receipt key holding a foreign type, a
 * script argument Redis or the script rejects). Retrying the same batch would
 * fail the same way forever while the stream stops behind it, so the batch is
 * split in halves, each run as its own batch, down to single parts; a single
 * part that still fails is reported as refused, and its message is
 * dead-lettered (`count-refused`) with the error. Such a failure comes before
 * the first write of the step that raised it (the scripts check before they
 * write), and a batch whose counts span slots takes back what its other
 * count shards wrote before it fails (cross-slot-counts.ts), so a failed run
 * leaves nothing to undo.
 *
 * Each half gets an id derived from its parent's (`<id>.0`, `<id>.1`): a
 * rerun of the parent splits the same way and finds the halves' receipts.
 */
import { classifyError, describeError, type BatchResult, type CountRefusal } from '@tally/shared';

/** Runs parts [from, to) of the batch as one batch under `batchId`; rejects only with a `data` failure. */
export type RunRange = (batchId: string, from: number, to: number) => Promise<BatchResult>;

/** Called when a run failed for its data and is about to be split (or, for one part, refused). */
export type OnDataFailure = (error: unknown, batchId: string, from: number, to: number) => void;

export async function runIsolating(
  vshard: number,
  parts: number,
  batchId: string,
  run: RunRange,
  onDataFailure: OnDataFailure = () => {},
): Promise<BatchResult> {
  const isolate = async (id: string, from: number, to: number): Promise<BatchResult> => {
    try {
      return await run(id, from, to);
    } catch (error) {
      if (classifyError(error) !== 'data') throw error;
      onDataFailure(error, id, from, to);
      if (to - from === 1) return refusedPart(vshard, error);
      const middle = from + Math.floor((to - from) / 2);
      const left = await isolate(`${id}.0`, from, middle);
      const right = await isolate(`${id}.1`, middle, to);
      return concatResults(left, right);
    }
  };
  return isolate(batchId, 0, parts);
}

/** The result of a one-part batch Redis refused as a whole: not marked, not counted, refused. */
export function refusedPart(vshard: number, error: unknown): BatchResult {
  return {
    vshard,
    marked: new Uint8Array(1),
    writeRetries: 0,
    occupationFailures: 0,
    waitTimeouts: 0,
    refusals: [{ part: 0, key: '', sku: '', delta: '', error: describeError(error) }],
    claimTakeovers: 0,
    timings: { precheckMs: 0, writeMs: 0, occupyMs: 0 },
  };
}

/** Two consecutive ranges' results as one: parts of `right` follow those of `left`. */
export function concatResults(left: BatchResult, right: BatchResult): BatchResult {
  const marked = new Uint8Array(left.marked.length + right.marked.length);
  marked.set(left.marked, 0);
  marked.set(right.marked, left.marked.length);
  const shifted: CountRefusal[] = right.refusals.map((refusal) => ({ ...refusal, part: refusal.part + left.marked.length }));
  return {
    vshard: left.vshard,
    marked,
    writeRetries: left.writeRetries + right.writeRetries,
    occupationFailures: Math.max(left.occupationFailures, right.occupationFailures),
    waitTimeouts: left.waitTimeouts + right.waitTimeouts,
    refusals: [...left.refusals, ...shifted],
    claimTakeovers: left.claimTakeovers + right.claimTakeovers,
    nativeClaims: (left.nativeClaims ?? 0) + (right.nativeClaims ?? 0),
    adoptedParts: (left.adoptedParts ?? 0) + (right.adoptedParts ?? 0),
    ...(left.watermarks === undefined && right.watermarks === undefined ? {} : { watermarks: [...(left.watermarks ?? []), ...(right.watermarks ?? [])] }),
    timings: {
      precheckMs: left.timings.precheckMs + right.timings.precheckMs,
      writeMs: left.timings.writeMs + right.timings.writeMs,
      occupyMs: left.timings.occupyMs + right.timings.occupyMs,
    },
  };
}
