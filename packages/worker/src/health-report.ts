/**
 * The thread's side of shared/src/redis-health.ts: wraps a batch step so that
 * a failed attempt posts a `refused` event and the first success after one
 * posts `recovered`, per virtual shard. Nothing is posted on the normal path.
 */
import { BroadcastChannel } from 'node:worker_threads';
import { describeRefusal, isServerRefusal, REDIS_HEALTH_CHANNEL, type RedisHealthEvent } from '@tally/shared';

let channel: BroadcastChannel | null = null;
/** Shards with a refusal posted and no success since. */
const refusedShards = new Set<number>();

function post(event: RedisHealthEvent): void {
  if (channel === null) {
    channel = new BroadcastChannel(REDIS_HEALTH_CHANNEL);
    // Posting must not keep a thread (or a test process) alive.
    channel.unref();
  }
  channel.postMessage(event);
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
