/**
 * Pure statistics for the bench: medians across rounds, latency
 * percentiles, and ratios taken pair by pair within a round. No I/O.
 *
 * Why pair by pair: RabbitMQ and Redis are shared with other work on this
 * machine, so absolute speeds drift from one minute to the next. Two
 * contenders run back to back inside one round see nearly the same machine,
 * so their ratio is stable even when both speeds move; the median of those
 * per-round ratios is what the bench reports, never a ratio of medians.
 */

/** Median of the finite values; NaN when there is none. */
export function median(values: readonly number[]): number {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/**
 * Nearest-rank percentile (p in [0, 100]) of a sorted ascending array: the
 * smallest value with at least p% of the samples at or below it. NaN when
 * empty. Nearest-rank never invents a latency nobody saw.
 */
export function percentileSorted(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile must be within 0..100, got ${p}`);
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[rank - 1]!;
}

export interface LatencySummary {
  readonly samples: number;
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
}

export function summarizeLatencies(values: readonly number[]): LatencySummary {
  const sorted = Float64Array.from(values).sort();
  return {
    samples: sorted.length,
    p50: percentileSorted(sorted, 50),
    p99: percentileSorted(sorted, 99),
    max: sorted.length === 0 ? Number.NaN : sorted[sorted.length - 1]!,
  };
}

/**
 * Ratios numerator[r] / denominator[r] for every round r where both are
 * finite and the denominator is positive. Rounds where either contender is
 * missing (not available, failed) are skipped, not guessed.
 */
export function pairwiseRatios(numerators: ReadonlyArray<number | null | undefined>, denominators: ReadonlyArray<number | null | undefined>): number[] {
  const ratios: number[] = [];
  const rounds = Math.min(numerators.length, denominators.length);
  for (let r = 0; r < rounds; r++) {
    const n = numerators[r];
    const d = denominators[r];
    if (typeof n === 'number' && typeof d === 'number' && Number.isFinite(n) && Number.isFinite(d) && d > 0) ratios.push(n / d);
  }
  return ratios;
}

/** Median of the per-round ratios: NaN when no round had both. */
export function medianRatio(numerators: ReadonlyArray<number | null | undefined>, denominators: ReadonlyArray<number | null | undefined>): number {
  return median(pairwiseRatios(numerators, denominators));
}
