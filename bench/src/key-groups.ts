/**
 * Pure: splits keys into the groups one multi-key command (MGET) may carry.
 * On a standalone server any keys go together, in chunks of at most `max`.
 * On a Redis Cluster one command must stay within one slot; every key of a
 * virtual shard carries its hash tag `{<vshard>}`, so the keys are grouped by
 * shard first (CROSSSLOT otherwise), then chunked.
 */
export function keyGroups<T extends { readonly vshard: number }>(items: readonly T[], bySlot: boolean, max = Number.POSITIVE_INFINITY): T[][] {
  if (!(max >= 1)) throw new RangeError(`keyGroups: max must be at least 1, got ${max}`);
  const shards = new Map<number, T[]>();
  for (const item of items) {
    const key = bySlot ? item.vshard : 0;
    const group = shards.get(key);
    if (group) group.push(item);
    else shards.set(key, [item]);
  }
  const groups: T[][] = [];
  for (const group of shards.values()) for (let i = 0; i < group.length; i += max) groups.push(group.slice(i, i + max));
  return groups;
}
