/**
 * The thread's side of shared/src/redis-health.ts: wraps a batch step so that
 * a failed attempt posts a `refused` event and the first success after one
 * posts `recovered`, per virtual shard, to the coordinator as a ThreadEvent
 * on the thread's port (thread-protocol.ts). Nothing is posted on the normal path.
 */
import { parentPort } from 'node:worker_threads';
import { describeRefusal, isServerRefusal, type RedisHealthEvent, type ThreadEvent } from '@tally/shared';

/** Shards with a refusal posted and no success since. */
const refusedShards = new Set<number>();

function post(health: RedisHealthEvent): void {
  const event: ThreadEvent = { kind: 'redis-health', health };
  // Outside a worker thread (a test running a batch in-process) there is no coordinator to tell.
  parentPort?.postMessage(event);
}

/** `run`, reporting its failures and the recovery that follows them to the coordinator. */
export function reportingHealth<T>(vshard: number, run: () => Promise<T>): () => Promise<T> {
  return async () => {
    try {
      const value = await run();
      if (refusedShards.delete(vshard)) post({ kind: 'recovered', source: `shard ${vshard}` });
      return value;
    } catch (error) {
      const refusal = describeRefusal(error);
      if (isServerRefusal(refusal.failureClass)) {
        refusedShards.add(vshard);
        post({ kind: 'refused', source: `shard ${vshard}`, ...refusal });
      }
      throw error;
    }
  };
}
