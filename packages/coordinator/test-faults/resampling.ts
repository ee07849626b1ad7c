/**
 * How far a ratio of lumpy samples to a measured estimate can stray by luck:
 * a bootstrap over groups (a victim daemon's samples together with what the
 * meter measured over its life, since both come from the same running time).
 */
export interface BootstrapSpread {
  /** Standard deviation of the resampled ratio, relative to the observed ratio. */
  readonly relativeStandardError: number;
  /** Share of resampled ratios whose quotient by the observed one falls outside [low, high]: the false-failure rate of that check for an exact estimate. */
  readonly outsideShare: number;
}

/** One group: its samples, and the estimate over the same time as a quotient (for W: window message-ms over loaded ms; a constant factor such as units per message cancels out). */
export interface RatioGroup {
  readonly samples: readonly number[];
  readonly estimateNumerator: number;
  readonly estimateDenominator: number;
}

/**
 * Resamples whole groups and recomputes (mean of the samples) / (Σ numerator
 * / Σ denominator). The estimate's own noise counts as well as the samples':
 * a meter's time average over a few seconds of a lumpy window is not exact.
 */
export function bootstrapRatio(groups: readonly RatioGroup[], low: number, high: number, resamples: number, random: () => number): BootstrapSpread {
  const sums = groups.map((group) => group.samples.reduce((a, b) => a + b, 0));
  const sizes = groups.map((group) => group.samples.length);
  const ratioOf = (picks: readonly number[]): number => {
    let sum = 0;
    let size = 0;
    let numerator = 0;
    let denominator = 0;
    for (const g of picks) {
      sum += sums[g]!;
      size += sizes[g]!;
      numerator += groups[g]!.estimateNumerator;
      denominator += groups[g]!.estimateDenominator;
    }
    return sum / size / (numerator / denominator);
  };
  const observed = ratioOf(groups.map((_, g) => g));
  if (!(observed > 0 && Number.isFinite(observed))) return { relativeStandardError: Number.POSITIVE_INFINITY, outsideShare: 1 };
  let outside = 0;
  let sumRatio = 0;
  let sumSquares = 0;
  const picks = new Array<number>(groups.length);
  for (let r = 0; r < resamples; r++) {
    for (let g = 0; g < groups.length; g++) picks[g] = Math.floor(random() * groups.length);
    const ratio = ratioOf(picks) / observed;
    // A resample whose groups have no loaded time at all has no estimate: count it as a failure.
    if (!Number.isFinite(ratio) || ratio < low || ratio > high) outside++;
    if (Number.isFinite(ratio)) {
      sumRatio += ratio;
      sumSquares += ratio * ratio;
    }
  }
  const mean = sumRatio / resamples;
  return { relativeStandardError: Math.sqrt(Math.max(0, sumSquares / resamples - mean * mean)), outsideShare: outside / resamples };
}
