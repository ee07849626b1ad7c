/** mulberry32: a small seeded PRNG, so a workload and its truth are reproducible from a seed. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function randomInt(random: () => number, min: number, max: number): number {
  return min + Math.floor(random() * (max - min + 1));
}

/**
 * Picks SKU ranks with a Zipf(s) skew over n items; s = 0 is uniform.
 * Precomputes the CDF once, then each draw is a binary search.
 */
export function zipfPicker(n: number, s: number, random: () => number): () => number {
  if (s === 0) return () => Math.floor(random() * n);
  const cdf = new Float64Array(n);
  let total = 0;
  for (let k = 0; k < n; k++) {
    total += 1 / (k + 1) ** s;
    cdf[k] = total;
  }
  return () => {
    const target = random() * total;
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (cdf[mid]! < target) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
}
