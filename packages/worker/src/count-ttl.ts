/**
 * When a count key's TTL is set: not on every write (one EXPIRE per SKU per
 * batch was about as much Redis work as the INCRBY itself), but when the key
 * is created (the scripts see that themselves: its value is the delta) and
 * when this thread last refreshed it more than `intervalS` ago.
 *
 * The TTL a key gets is TALLY_COUNT_TTL_S plus that interval, so between two
 * refreshes its remaining TTL never drops below TALLY_COUNT_TTL_S: a count
 * still lives at least TALLY_COUNT_TTL_S after its last write (and at most
 * the interval longer). A SKU's virtual shard, and so its keys, always go to
 * the same thread, so one thread's memory covers them; another daemon's
 * writes refresh on their own schedule, which only adds refreshes.
 *
 * The memory is bounded: past `maxKeys` the least recently refreshed keys are
 * forgotten, and a forgotten key is simply refreshed again on its next write.
 */

/** The refresh interval for a count TTL: an hour, or a tenth of a shorter TTL (0: refresh on every write). */
export function countRefreshIntervalS(countTtlS: number): number {
  return Math.min(3_600, Math.floor(countTtlS / 10));
}

export class CountTtlRefresh {
  /** Key -> when this thread last set its TTL (ms); insertion order is refresh order, oldest first. */
  private readonly refreshedAt = new Map<string, number>();
  private readonly intervalMs: number;
  /** The TTL the scripts give a count key: the configured one plus the refresh interval. */
  readonly ttlS: number;

  constructor(
    countTtlS: number,
    private readonly maxKeys = 500_000,
  ) {
    const intervalS = countRefreshIntervalS(countTtlS);
    this.intervalMs = intervalS * 1000;
    this.ttlS = countTtlS + intervalS;
  }

  /**
   * The scripts' refresh argument for `keys` (in their order): one character
   * per key, '1' when its TTL is due; '' when none is (the usual batch).
   * The keys it marks due count as refreshed from `nowMs`: call it for the
   * attempt that will be retried until it writes, not speculatively.
   */
  due(keys: readonly string[], nowMs: number): string {
    if (this.intervalMs === 0) return '1'.repeat(keys.length);
    let flags: string[] | null = null;
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i]!;
      const at = this.refreshedAt.get(key);
      if (at !== undefined && nowMs - at < this.intervalMs) continue;
      flags ??= new Array<string>(keys.length).fill('0');
      flags[i] = '1';
      // Re-inserted at the end: the map stays ordered by refresh time.
      this.refreshedAt.delete(key);
      this.refreshedAt.set(key, nowMs);
    }
    if (this.refreshedAt.size > this.maxKeys) this.forgetOldest(this.refreshedAt.size - this.maxKeys);
    if (flags === null) return '';
    // Trailing '0's say nothing the script does not assume: drop them.
    let end = flags.length;
    while (end > 0 && flags[end - 1] === '0') end--;
    return flags.slice(0, end).join('');
  }

  /** Keys this thread remembers (for tests and the bound). */
  get size(): number {
    return this.refreshedAt.size;
  }

  private forgetOldest(count: number): void {
    for (const key of this.refreshedAt.keys()) {
      if (count-- <= 0) return;
      this.refreshedAt.delete(key);
    }
  }
}

/** One per thread and count TTL: a thread's settings never change, so in practice one. */
const perTtl = new Map<number, CountTtlRefresh>();
export function countTtlOf(countTtlS: number): CountTtlRefresh {
  let refresh = perTtl.get(countTtlS);
  if (refresh === undefined) perTtl.set(countTtlS, (refresh = new CountTtlRefresh(countTtlS)));
  return refresh;
}
