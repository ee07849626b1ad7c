// The seeded draws the notes' experiment scripts share: a linear congruential generator (the same sequence on every
// run) and Zipf-1 SKUs over `skus` (sku-0 the most frequent), as the bench's workload draws them.
export function seededDraws(seed, skus = 3000) {
  let state = seed;
  const random = () => ((state = (state * 1103515245 + 12345) % 2147483648), state / 2147483648);
  const weights = [];
  for (let i = 1, total = 0; i <= skus; i++) weights.push((total += 1 / i));
  const sku = () => {
    const x = random() * weights.at(-1);
    let lo = 0;
    for (let hi = weights.length - 1; lo < hi; ) {
      const mid = (lo + hi) >> 1;
      if (weights[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    return `sku-${lo}`;
  };
  return { random, sku };
}
