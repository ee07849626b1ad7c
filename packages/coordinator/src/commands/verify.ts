import { readFile } from 'node:fs/promises';

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

/** Compares counts with a ground truth; SKUs absent on either side count as 0. */
export function verify(counts: Map<string, string>, truth: Map<string, number>): Verdict {
  let exact = 0;
  let below = 0;
  let above = 0;
  let excessUnits = 0;
  let missingUnits = 0;
  const skus = new Set([...counts.keys(), ...truth.keys()]);
  for (const sku of skus) {
    const diff = Number(counts.get(sku) ?? 0) - (truth.get(sku) ?? 0);
    if (diff === 0) exact++;
    else if (diff < 0) {
      below++;
      missingUnits -= diff;
    } else {
      above++;
      excessUnits += diff;
    }
  }
  return { skus: skus.size, exact, below, above, excessUnits, missingUnits };
}
