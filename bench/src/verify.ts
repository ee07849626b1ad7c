/**
 * Did a contender count correctly? The comparison is pure; reading the
 * counts back from Redis is the thin I/O beside it.
 */
import type { Redis } from 'ioredis';
import { countScanPattern, skuOfCountKey } from '@tally/shared';

export interface CountCheck {
  readonly exact: boolean;
  /** SKUs below the truth: a loss. */
  readonly below: number;
  /** SKUs above the truth: a double count. */
  readonly above: number;
  /** A few offending SKUs with (got, want), for the report. */
  readonly examples: ReadonlyArray<readonly [sku: string, got: number, want: number]>;
}

export function compareCounts(counts: ReadonlyMap<string, number>, truth: ReadonlyMap<string, number>): CountCheck {
  let below = 0;
  let above = 0;
  const examples: Array<[string, number, number]> = [];
  for (const sku of new Set([...counts.keys(), ...truth.keys()])) {
    const got = counts.get(sku) ?? 0;
    const want = truth.get(sku) ?? 0;
    if (got === want) continue;
    if (got < want) below++;
    else above++;
    if (examples.length < 3) examples.push([sku, got, want]);
  }
  return { exact: below === 0 && above === 0, below, above, examples };
}

export function describeCheck(check: CountCheck): string {
  if (check.exact) return 'exact';
  return `${check.below} SKU(s) below the truth, ${check.above} above; e.g. ${check.examples.map(([s, g, w]) => `${s} ${g} != ${w}`).join(', ')}`;
}

/** Every count under a prefix (the key layout Tally and the naive consumer share). */
export async function readAllCounts(redis: Redis, prefix: string): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', countScanPattern(prefix), 'COUNT', 2000);
    cursor = next;
    if (keys.length === 0) continue;
    const values = await redis.mget(keys);
    keys.forEach((key, i) => {
      const sku = skuOfCountKey(prefix, key);
      if (sku !== null && values[i] !== null) counts.set(sku, Number(values[i]));
    });
  } while (cursor !== '0');
  return counts;
}

/** Keys matching a pattern (SCAN, never KEYS). */
export async function scanKeys(redis: Redis, pattern: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 2000);
    cursor = next;
    found.push(...keys);
  } while (cursor !== '0');
  return found;
}
