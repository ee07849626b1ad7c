/**
 * The known name nearest to a misspelled one, for "did you mean …?" (an
 * unknown TALLY_* variable, config.ts). Pure: no environment, no I/O.
 */

/**
 * Edit distance between two strings: insertions, deletions, substitutions
 * and swaps of two neighbouring characters each cost 1 (the optimal string
 * alignment distance: Levenshtein plus transpositions, because `MDOE` for
 * `MODE` is one slip of the fingers, not two).
 */
export function editDistance(a: string, b: string): number {
  if (a === b) return 0;
  if (a.length === 0) return b.length;
  if (b.length === 0) return a.length;
  // Three rows are enough: a transposition looks two rows back.
  let before = new Array<number>(b.length + 1).fill(0);
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  let current = new Array<number>(b.length + 1).fill(0);
  for (let i = 1; i <= a.length; i++) {
    current[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let best = Math.min(previous[j]! + 1, current[j - 1]! + 1, previous[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) best = Math.min(best, before[j - 2]! + 1);
      current[j] = best;
    }
    [before, previous, current] = [previous, current, before];
  }
  return previous[b.length]!;
}

export interface ClosestName {
  readonly name: string;
  readonly distance: number;
  /** True when the distance is small for the name's length: worth a "did you mean". */
  readonly close: boolean;
}

/**
 * The candidate nearest to `name`, compared without regard to case (an
 * environment variable typed in lower case is still that variable); the
 * first in `candidates` wins a tie. null when there is no candidate. Close
 * means at most 2 edits, or a third of the name's length for a long name.
 */
export function closestName(name: string, candidates: readonly string[]): ClosestName | null {
  const wanted = name.toUpperCase();
  let best: { name: string; distance: number } | null = null;
  for (const candidate of candidates) {
    const distance = editDistance(wanted, candidate.toUpperCase());
    if (best === null || distance < best.distance) best = { name: candidate, distance };
  }
  if (best === null) return null;
  return { ...best, close: best.distance <= Math.max(2, Math.floor(wanted.length / 3)) };
}
