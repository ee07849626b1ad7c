/**
 * The Redis edge of the daemon, opened first: the start-up probe (a Redis
 * that cannot keep Tally's promise stops the start before anything is
 * written), then the client of the topology it found, the health every
 * writer reports to, with TALLY_REDIS_WAIT_REPLICAS the replica watch, and
 * behind Sentinel the watch that names the primary and a failover.
 */
import type { Redis } from 'ioredis';
import { isSentinelUrl, parseSentinelUrl, redactUrl } from '@tally/shared';
import { createRedisClient, isCluster, nodeAddress, REVIVING, REVIVING_MESSAGE, type RedisClient } from '@tally/runtime';
import type { CloseStep } from '../process/close-steps.js';
import { checkNotInterrupted, type StartContext } from '../process/start-context.js';
import { RedisHealth } from './redis-health.js';
import { probeRedis, type RedisProbeReport } from './redis-probe.js';
import { startReplicaWatch, type ReplicaWatch } from './replica-watch.js';
import { SentinelWatch } from './sentinel-watch.js';
import { untilRedis } from './until-redis.js';

export interface RedisEdge {
  /** What the start-up probe found (docs/redis-requirements.md). */
  readonly probe: RedisProbeReport;
  /** Standalone or cluster client, as the probe found (redis-connection.ts). */
  readonly client: RedisClient;
  /** Whether Redis refuses writes right now, as every writer sees it (redis-health.ts). */
  readonly health: RedisHealth;
  /** With TALLY_REDIS_WAIT_REPLICAS: the masters that cannot meet the WAIT (replica-watch.ts); null without. */
  readonly replicaWatch: ReplicaWatch | null;
  /** With redis+sentinel://: the primary and any failover in progress (sentinel-watch.ts); null without. */
  readonly sentinelWatch: SentinelWatch | null;
}

export async function openRedis(context: StartContext): Promise<RedisEdge> {
  const { config, log, closeSteps } = context;
  const probe = await untilRedis(context, 'redis probe', () => probeRedis(config, log));
  checkNotInterrupted(context);
  const client = createRedisClient(config.redisUrl, 'tally-coordinator', {}, probe.topology);
  if (probe.topology === 'cluster') log.info({ masters: probe.masters }, 'redis cluster detected: one slot per virtual shard');
  client.on('error', () => {});
  // Behind Sentinel, `node` names the primary this connection reached (it changes with a failover).
  client.on('ready', () => log.info({ redis: redactUrl(config.redisUrl), node: isCluster(client) ? undefined : nodeAddress(client) }, 'redis ready'));
  client.on('end', () => log.warn('redis connection ended'));
  client.on(REVIVING, (delayMs: number) => log.warn({ delayMs }, REVIVING_MESSAGE));
  closeSteps.add(closeRedisStep(client));
  const health = new RedisHealth(log);
  const replicaWatch = startReplicaWatch(client, config, log);
  if (replicaWatch !== null) closeSteps.add({ name: 'stopping the replica watch', run: () => replicaWatch.stop() });
  const sentinelWatch = isSentinelUrl(config.redisUrl) ? new SentinelWatch(parseSentinelUrl(config.redisUrl), client as Redis, log) : null;
  if (sentinelWatch !== null) {
    sentinelWatch.start();
    closeSteps.add({ name: 'stopping the sentinel watch', run: () => sentinelWatch.stop() });
  }
  return { probe, client, health, replicaWatch, sentinelWatch };
}

/** QUIT, or a plain disconnect when the server does not answer it in time (a hung Redis never would). */
function closeRedisStep(redis: RedisClient): CloseStep & { name: 'closing redis' } {
  return {
    name: 'closing redis',
    timeoutMs: 500,
    run: () => redis.quit().catch(() => redis.disconnect()),
    force: () => redis.disconnect(),
  };
}
