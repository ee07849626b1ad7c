/**
 * Count refusals as the scripts report them, turned into
 * CountRefusals and logged with their key and delta. Both modes' scripts
 * return one `{part index (1-based), count key, delta, Redis error}` per
 * refused part; the part counted nothing and occupies no marker.
 */
import { partName, skuOfCountKey, type BatchTask, type CountRefusal } from '@tally/shared';
import type { BatchLog } from './batch-log.js';

/** Refusals logged one by one per batch; the rest are summed in one line (a poisoned hot key would flood the log). */
const LOGGED_PER_BATCH = 5;

export function decodeRefusals(raw: unknown, prefix: string): CountRefusal[] {
  if (!Array.isArray(raw)) throw new TypeError(`count refusals: expected an array from the script, got ${typeof raw}`);
  return raw.map((entry: unknown) => {
    if (!Array.isArray(entry) || entry.length !== 4) throw new TypeError('count refusals: malformed entry from the script');
    const [part, key, delta, error] = entry as [number, string, string, string];
    return { part: Number(part) - 1, key: String(key), sku: skuOfCountKey(prefix, String(key)) ?? '', delta: String(delta), error: String(error) };
  });
}

export function logRefusals(log: BatchLog, task: BatchTask, refusals: readonly CountRefusal[]): void {
  if (refusals.length === 0) return;
  for (const refusal of refusals.slice(0, LOGGED_PER_BATCH)) {
    log.error(
      {
        vshard: task.vshard,
        batchId: task.batchId,
        // Ids do not cross the thread boundary (batch-protocol.ts): the part's digest names its message.
        messageDigest: partName(task, refusal.part),
        key: refusal.key,
        sku: refusal.sku,
        delta: refusal.delta,
        err: refusal.error,
      },
      'redis refused a count increment: the part counted nothing and its message goes to the dead-letter queue (count-refused)',
    );
  }
  if (refusals.length > LOGGED_PER_BATCH) {
    log.error(
      { vshard: task.vshard, batchId: task.batchId, more: refusals.length - LOGGED_PER_BATCH },
      'more count refusals in this batch (not logged one by one)',
    );
  }
}
