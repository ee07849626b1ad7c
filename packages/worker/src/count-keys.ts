/**
 * The count key of a SKU in a batch. With part-scoped markers every change
 * of a shard batch is on the batch's own virtual shard. With message-scoped
 * markers a batch is a marker shard's messages, whole, and each change goes
 * to its SKU's own shard's key: the keys a SKU's count lives in never depend
 * on the marker scope (invariant 3), and `tally counts` reads them as ever.
 */
import { countKey, shardOf, type WorkerSettings } from '@tally/shared';

export function countKeysOf(settings: Pick<WorkerSettings, 'prefix' | 'markerScope' | 'virtualShards'>, vshard: number): (sku: string) => string {
  const { prefix } = settings;
  if (settings.markerScope !== 'message') return (sku) => countKey(prefix, vshard, sku);
  const shards = settings.virtualShards;
  // A TypeError, not a default: a thread that guessed the shard count would write counts where no reader looks.
  if (shards === undefined) throw new TypeError('message-scoped markers need the virtual shard count in the worker settings');
  return (sku) => countKey(prefix, shardOf(sku, shards), sku);
}
