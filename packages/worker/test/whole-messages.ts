import { randomUUID } from 'node:crypto';
import { markerDigest, markerShardOf, type BatchTask } from '@tally/shared';

/**
 * Whole messages of one marker shard, each with changes on several SKU
 * shards (of `shards` virtual shards): what the daemon sends with
 * message-scoped markers. Ids are `<runId>-<n>`.
 */
export function wholeMessagesOf(runId: string, markerShard: number, count: number, shards: number): BatchTask & { ids: string[] } {
  const ids: string[] = [];
  const changes: Array<Array<[string, number]>> = [];
  for (let n = 0; ids.length < count; n++) {
    const id = `${runId}-${n}`;
    if (markerShardOf(markerDigest(id), shards) !== markerShard) continue;
    ids.push(id);
    changes.push([
      [`A${n % 5}`, 1],
      [`B${n % 7}`, 2],
      [`C${n % 11}`, 3],
    ]);
  }
  return { vshard: markerShard, batchId: randomUUID(), ids, changes };
}
