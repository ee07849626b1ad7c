/**
 * How far a mean of lumpy samples can stray by luck: a bootstrap over groups
 * of samples (a victim daemon's samples together, since samples of one life
 * are correlated: its lanes start together after a restart).
 */
export interface BootstrapSpread {
  /** Standard deviation of the resampled mean, relative to the observed mean. */
  readonly relativeStandardError: number;
  /** Share of resampled means whose ratio to the observed mean falls outside [low, high]: the false-failure rate of that check for an exact estimate. */
  readonly outsideShare: number;
}

export function bootstrapMean(groups: readonly (readonly number[])[], low: number, high: number, resamples: number, random: () => number): BootstrapSpread {
  const sums = groups.map((samples) => samples.reduce((a, b) => a + b, 0));
  const sizes = groups.map((samples) => samples.length);
  const observed = sums.reduce((a, b) => a + b, 0) / sizes.reduce((a, b) => a + b, 0);
  if (!(observed > 0)) return { relativeStandardError: Number.POSITIVE_INFINITY, outsideShare: 1 };
  let outside = 0;
  let sumRatio = 0;
  let sumSquares = 0;
  for (let r = 0; r < resamples; r++) {
    let sum = 0;
    let size = 0;
    for (let g = 0; g < groups.length; g++) {
      const pick = Math.floor(random() * groups.length);
      sum += sums[pick]!;
      size += sizes[pick]!;
    }
    const ratio = sum / size / observed;
    if (ratio < low || ratio > high) outside++;
    sumRatio += ratio;
    sumSquares += ratio * ratio;
  }
  const mean = sumRatio / resamples;
  return { relativeStandardError: Math.sqrt(Math.max(0, sumSquares / resamples - mean * mean)), outsideShare: outside / resamples };
}
