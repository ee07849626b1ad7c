/**
 * The worker threads: one single-thread pool per owner (worker-pools.ts),
 * given the prefix's recorded layout, not the daemon's own settings. What a
 * thread posts while a batch runs reaches the counters and the Redis health
 * as it happens: a WAIT that keeps timing out holds its batch, and a Redis
 * that refuses a batch step makes it retry quietly; both must show meanwhile.
 */
import { fencedAdoptionOf, filterBitsOfFormat } from '@tally/shared';
import type { Layout } from '../fleet/layout-guard.js';
import { STEP_TIMEOUT_MS } from '../process/close-steps.js';
import type { StartContext, Threads } from '../process/start-context.js';
import type { RedisEdge } from '../redis/open-redis.js';
import type { CountersEdge } from '../telemetry/open-counters.js';
import { WorkerPools } from './worker-pools.js';

export function openThreads(context: StartContext, redis: RedisEdge, layout: Layout, counters: CountersEdge): Threads {
  const { config, log, closeSteps } = context;
  const pools = new WorkerPools(
    {
      redisUrl: config.redisUrl,
      redisTopology: redis.probe.topology,
      prefix: config.prefix,
      mode: config.mode,
      markerTtlS: config.markerTtlS,
      countTtlS: config.countTtlS,
      logLevel: config.logLevel,
      markerBucketS: layout.markers.bucketS,
      markerSubBuckets: layout.markers.subBuckets,
      markerScope: layout.markers.scope,
      markerFilterBits: filterBitsOfFormat(layout.markers.format),
      fencedAdoption: fencedAdoptionOf(layout.markers.format),
      virtualShards: config.virtualShards,
      claimToken: context.claimToken,
      claimTtlMs: config.markerClaimTtlS * 1000,
      // A native claim's record names no batch: fenced adoption could not adopt it.
      nativeClaims: config.markerNativeClaims && !fencedAdoptionOf(layout.markers.format),
      ...(counters.windowGauge === null ? {} : { windowGauge: counters.windowGauge.buffer }),
      waitReplicas: config.redisWaitReplicas,
      waitTimeoutMs: config.redisWaitTimeoutMs,
      source: config.source,
    },
    config.workers,
    config.virtualShards,
    (event) => {
      if (event.kind === 'wait-timeout') {
        counters.stats.add('wait_timeouts');
        redis.replicaWatch?.nudge();
      } else if (event.kind === 'undo-failed') counters.stats.add('undo_failures', event.parts);
      else redis.health.apply(event.health);
    },
  );
  closeSteps.add({ name: 'flushing worker spans', timeoutMs: 500, run: () => pools.flushTelemetry() });
  closeSteps.add({
    name: 'stopping worker threads',
    timeoutMs: STEP_TIMEOUT_MS,
    run: async () => {
      await pools.destroy();
      log.info('worker threads stopped');
    },
  });
  return pools;
}
