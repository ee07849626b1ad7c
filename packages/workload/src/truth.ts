/**
 * Did the counts come out right? The one comparison of counts read back from
 * Redis with a workload's truth, for `tally verify`, the bench and the tests.
 * Pure: reading the counts is the caller's I/O.
 */

export interface TruthCheck {
  /** SKUs on either side. */
  readonly skus: number;
  /** No SKU below the truth and none above it. */
  readonly exact: boolean;
  /** SKUs below the truth: lost changes. */
  readonly below: readonly string[];
  /** Units lost over those SKUs. */
  readonly missingUnits: number;
  /** SKUs above the truth, with how many units each: the overcount. */
  readonly excess: ReadonlyMap<string, number>;
  readonly excessUnits: number;
}

/**
 * Compares counts with a truth; a SKU absent on either side counts as 0.
 * Counts may be the raw strings Redis returns (`tally counts` keeps them
 * exact); a difference is in units well inside 2^53.
 */
export function compareWithTruth(counts: ReadonlyMap<string, number | string>, truth: ReadonlyMap<string, number>): TruthCheck {
  const below: string[] = [];
  const excess = new Map<string, number>();
  let missingUnits = 0;
  let excessUnits = 0;
  const skus = new Set([...counts.keys(), ...truth.keys()]);
  for (const sku of skus) {
    const diff = Number(counts.get(sku) ?? 0) - (truth.get(sku) ?? 0);
    if (diff < 0) {
      below.push(sku);
      missingUnits -= diff;
    } else if (diff > 0) {
      excess.set(sku, diff);
      excessUnits += diff;
    }
  }
  return { skus: skus.size, exact: below.length === 0 && excess.size === 0, below, missingUnits, excess, excessUnits };
}

/** One line for a log or a report: "exact", or how far off and a few examples as `sku got != want`. */
export function describeTruthCheck(check: TruthCheck, counts: ReadonlyMap<string, number | string>, truth: ReadonlyMap<string, number>): string {
  if (check.exact) return 'exact';
  const examples = [...check.below, ...check.excess.keys()].slice(0, 3).map((sku) => `${sku} ${counts.get(sku) ?? 0} != ${truth.get(sku) ?? 0}`);
  return `${check.below.length} SKU(s) below the truth (${check.missingUnits} units), ${check.excess.size} above (${check.excessUnits} units); e.g. ${examples.join(', ')}`;
}
