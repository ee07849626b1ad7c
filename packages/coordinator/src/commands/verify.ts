/**
 * `tally verify`: the counts against a truth file written by `tally publish --truth`.
 */
import { readFile } from 'node:fs/promises';
import { compareWithTruth } from '@tally/workload';

export interface Verdict {
  readonly skus: number;
  readonly exact: number;
  /** SKUs below the truth: lost changes. Must be 0. */
  readonly below: number;
  /** SKUs above the truth, and by how many units in all: the visible overcount. */
  readonly above: number;
  readonly excessUnits: number;
  readonly missingUnits: number;
}

/** Reads a truth file written by `tally publish --truth`: `{ "counts": { sku: n } }`. */
export async function readTruth(path: string): Promise<Map<string, number>> {
  const parsed = JSON.parse(await readFile(path, 'utf8')) as { counts?: Record<string, number> };
  if (parsed.counts === null || typeof parsed.counts !== 'object') throw new Error(`${path}: no "counts" object`);
  return new Map(Object.entries(parsed.counts));
}

/** Compares counts with a ground truth (SKUs absent on either side count as 0), in the CLI's per-SKU tallies. */
export function verify(counts: Map<string, string>, truth: Map<string, number>): Verdict {
  const check = compareWithTruth(counts, truth);
  return {
    skus: check.skus,
    exact: check.skus - check.below.length - check.excess.size,
    below: check.below.length,
    above: check.excess.size,
    excessUnits: check.excessUnits,
    missingUnits: check.missingUnits,
  };
}
