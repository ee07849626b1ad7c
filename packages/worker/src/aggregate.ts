/**
 * Pure: the new parts' changes summed per SKU for one batch (bigint past 2^53).
 */
import type { PartChanges } from '@tally/shared';

/** A SKU's summed delta for one batch; bigint only once a sum leaves the safe range. */
export type Sum = number | bigint;

/**
 * Sums the changes of the parts that are new (not marked) into one delta per
 * SKU: one INCRBY per SKU per batch, however many messages touched it. A SKU
 * whose deltas cancel out still gets an entry (0): its key's TTL is refreshed
 * like any other written SKU, and skipping it would save nothing measurable.
 */
export function aggregateNewParts(changes: readonly PartChanges[], isNew: (index: number) => boolean): Map<string, Sum> {
  const sums = new Map<string, Sum>();
  for (let i = 0; i < changes.length; i++) {
    if (!isNew(i)) continue;
    for (const [sku, delta] of changes[i]!) sums.set(sku, addToSum(sums.get(sku), delta));
  }
  return sums;
}

/** `previous` + `delta` (a safe integer), exactly: a number while the sum is a safe integer, a bigint past that. */
export function addToSum(previous: Sum | undefined, delta: number): Sum {
  if (previous === undefined) return delta;
  if (typeof previous === 'number') {
    const next = previous + delta;
    // Past 2^53 a double rounds; switch to bigint so the sum stays exact.
    return Number.isSafeInteger(next) ? next : BigInt(previous) + BigInt(delta);
  }
  return previous + BigInt(delta);
}
