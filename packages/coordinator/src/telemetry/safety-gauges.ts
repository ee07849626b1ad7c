/**
 * Gauges for the edges of Tally's promise that are not counters of the data
 * path: a Redis allowed to evict (TALLY_ALLOW_EVICTION), a Redis without AOF
 * or replicas, and the broker's side (a blocked connection, unroutable dead
 * letters). Kept apart
 * from metrics.ts, which holds the data-path metrics.
 *
 *   tally.redis.eviction_allowed     1 while running on an evicting maxmemory-policy
 *   tally.redis.unprotected          1 when neither AOF nor a replica protects acked counts
 *   tally.amqp.blocked               1 while RabbitMQ blocks the connection (memory or disk alarm)
 *   tally.dead_letter.unroutable     dead-letter copies the broker returned as unroutable
 *   tally.redis.replicas_short       per master (server.address, server.port): replicas missing for
 *                                    TALLY_REDIS_WAIT_REPLICAS (0 when it can be met); only with a WAIT
 *   tally.redis.failovers            primary switches seen behind Sentinel since start (tally.redis.sentinel.master);
 *                                    only with redis+sentinel://
 */
import type { Attributes, Meter } from '@opentelemetry/api';
import type { RedisProbeReport } from '../redis/redis-probe.js';

export interface SafetySources {
  readonly redisProbe: () => RedisProbeReport | null;
  readonly amqpBlocked: () => boolean;
  readonly unroutableDeadLetters: () => number;
  /** Replicas missing for the WAIT, by master `host:port` (replica-watch.ts); absent without TALLY_REDIS_WAIT_REPLICAS. */
  readonly replicasShort?: () => ReadonlyMap<string, number>;
  /** Behind Sentinel: the master group's name and the primary switches seen (sentinel-watch.ts); absent otherwise. */
  readonly failovers?: () => { readonly masterName: string; readonly failovers: number };
}

export function registerSafetyGauges(meter: Meter, base: Attributes, sources: SafetySources): void {
  meter
    .createObservableGauge('tally.redis.eviction_allowed', {
      description: 'Redis maxmemory-policy is not noeviction and TALLY_ALLOW_EVICTION allowed it: counts or markers may be evicted',
    })
    .addCallback((result) => {
      const probe = sources.redisProbe();
      if (probe !== null) result.observe(probe.evictionAllowed ? 1 : 0, { ...base, 'tally.redis.maxmemory_policy': probe.maxmemoryPolicy ?? 'unknown' });
    });
  meter
    .createObservableGauge('tally.redis.unprotected', { description: 'Neither AOF nor a connected replica protected acked counts at start' })
    .addCallback((result) => {
      const probe = sources.redisProbe();
      if (probe !== null) result.observe(!probe.aofEnabled && probe.connectedReplicas === 0 ? 1 : 0, base);
    });
  meter
    .createObservableGauge('tally.amqp.blocked', { description: 'RabbitMQ blocks the connection (memory or disk alarm): dead-letter publishes wait' })
    .addCallback((result) => result.observe(sources.amqpBlocked() ? 1 : 0, base));
  meter
    .createObservableCounter('tally.dead_letter.unroutable', {
      description: 'Dead-letter copies returned unroutable (the .dead queue is missing); their originals stay unacked and are retried',
    })
    .addCallback((result) => result.observe(sources.unroutableDeadLetters(), base));
  const replicasShort = sources.replicasShort;
  if (replicasShort !== undefined) {
    meter
      .createObservableGauge('tally.redis.replicas_short', {
        description: 'Per Redis master: replicas online short of TALLY_REDIS_WAIT_REPLICAS (its shards wait unacked while above 0); 0 when the WAIT can be met',
        unit: '{replica}',
      })
      .addCallback((result) => {
        for (const [address, missing] of replicasShort()) {
          const colon = address.lastIndexOf(':');
          result.observe(missing, { ...base, 'server.address': address.slice(0, colon), 'server.port': Number(address.slice(colon + 1)) });
        }
      });
  }
  const failovers = sources.failovers;
  if (failovers !== undefined) {
    meter
      .createObservableCounter('tally.redis.failovers', {
        description: 'Primary switches of the Sentinel master group seen since start: each one may have cost what WAIT did not guard',
        unit: '{failover}',
      })
      .addCallback((result) => {
        const { masterName, failovers: seen } = failovers();
        result.observe(seen, { ...base, 'tally.redis.sentinel.master': masterName });
      });
  }
}
