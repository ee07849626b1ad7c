/**
 * What this daemon shares with the others of its prefix, opened once Redis
 * answers: the layout check (virtual shards, marker format, mode lease,
 * partition count; a mismatch refuses the start before any thread starts),
 * the partition balancer (TALLY_PARTITIONS > 1) and the heartbeat that
 * renews the lease and drives the balancer.
 */
import {
  defaultMarkerScope,
  describeError,
  FENCED_MESSAGE_MARKER_FORMAT,
  fencedAdoptionOf,
  MarkerFormatRefusedError,
  messageScopeServes,
  needsFencedAdoption,
  type TallyConfig,
} from '@tally/shared';
import { scanNodes } from '@tally/runtime';
import { checkNotInterrupted, type LiveViews, type StartContext } from '../process/start-context.js';
import type { RedisEdge } from '../redis/open-redis.js';
import { untilRedis } from '../redis/until-redis.js';
import { Heartbeat, HEARTBEAT_TTL_BEATS, type HeartbeatSnapshot } from './heartbeat.js';
import { ensureLayout, ensurePartitionCount, type Layout } from './layout-guard.js';
import { PartitionBalancer } from './partition-balancer.js';

export interface FleetEdge {
  /** The prefix's recorded layout: every daemon of the prefix uses its marker settings, whatever its own. */
  readonly layout: Layout;
  /** Renews this daemon's heartbeat key and the mode lease its layout check took. */
  readonly heartbeat: Heartbeat;
  /** TALLY_PARTITIONS > 1: the partitions this daemon owns, after every beat; null with one queue. */
  readonly balancer: PartitionBalancer | null;
}

export async function openFleet(context: StartContext, redis: RedisEdge, live: LiveViews): Promise<FleetEdge> {
  const { config, log, closeSteps } = context;
  const { probe, client } = redis;
  const lease = { holder: context.daemonId, ttlMs: HEARTBEAT_TTL_BEATS * config.heartbeatMs };
  // Before the layout is recorded: a new prefix must not be laid out with a scope this Redis cannot serve.
  const oneSlotBatches = !messageScopeServes(probe.topology, config.mode, config.source);
  if (config.markerScope === 'message' && oneSlotBatches) throw messageScopeOnCluster(config);
  const proposedScope = config.markerScope ?? defaultMarkerScope(probe.topology, config.mode, config.source);
  const fenced = needsFencedAdoption(probe.topology, config.mode, config.source);
  const layout = await untilRedis(context, 'layout check', () =>
    ensureLayout(client, { ...config, markerScope: proposedScope, fencedAdoption: fenced }, lease),
  );
  checkNotInterrupted(context);
  log.info({ virtualShards: layout.virtualShards, created: layout.created, daemonId: context.daemonId, markers: layout.markers }, 'shard layout verified');
  if (layout.markers.scope === 'message' && oneSlotBatches) throw messageScopeOnCluster(config);
  if (layout.markers.scope === 'message' && fenced && !fencedAdoptionOf(layout.markers.format)) throw unfencedOnCluster(config, layout.markers.format);
  // Recorded like the virtual shards: daemons of another TALLY_PARTITIONS would compute other owners (docs/operations.md).
  await untilRedis(context, 'partition count check', () => ensurePartitionCount(client, config.prefix, config.partitions));
  checkNotInterrupted(context);
  if (config.markerScope !== null && layout.markers.scope !== config.markerScope) {
    log.warn(
      { configured: config.markerScope, recorded: layout.markers.scope },
      'TALLY_MARKER_SCOPE differs from the scope the prefix was laid out with; using the recorded one (every daemon of a prefix must)',
    );
  }

  // Streams have no single active consumer: even one stream is given to one daemon at a time, by the heartbeats.
  const partitioned = config.partitions > 1 || config.source === 'stream';
  const balancer = partitioned
    ? new PartitionBalancer(
        { prefix: config.prefix, queue: config.queue, partitions: config.partitions, selfId: context.daemonId },
        {
          nodes: () => scanNodes(client),
          assign: (partitions) => {
            live.source?.assign(partitions);
            // Three beats without a delivery over a queue with ready messages: subscribe again (partition-channels.ts says why).
            void live.source
              ?.checkIdlePartitions(3 * config.heartbeatMs)
              .catch((error) => log.warn({ err: describeError(error) }, 'idle partition check failed'));
          },
          leaving: () => context.stopping(),
          log,
        },
      )
    : null;

  // From the layout check on, not from the source: the beat renews the mode lease the check took (layout-guard.ts).
  const heartbeat = new Heartbeat(
    context.daemonId,
    {
      prefix: config.prefix,
      mode: config.mode,
      source: config.source,
      queue: config.queue,
      intervalMs: config.heartbeatMs,
      ttlMs: lease.ttlMs,
      partitions: config.partitions,
      ...(balancer === null ? {} : { afterBeat: () => balancer.rebalance() }),
    },
    {
      redis: client,
      snapshot: (): HeartbeatSnapshot => {
        const ageMs = live.pipeline?.oldestUnackedAgeMs() ?? null;
        return {
          consuming: live.source?.consuming ?? false,
          oldestUnackedS: ageMs === null ? null : ageMs / 1000,
          inFlight: live.pipeline?.unacked ?? 0,
          amqpNode: live.source?.node ?? null,
          ...(partitioned ? { partitions: live.source?.partitionsHeld ?? [], leaving: context.stopping() } : {}),
        };
      },
      log,
    },
  );
  heartbeat.start();
  closeSteps.add({ name: 'stopping the heartbeat', timeoutMs: 500, run: () => heartbeat.stop() });
  return { layout, heartbeat, balancer };
}

/**
 * Message-scoped markers on a Redis Cluster, for a stream: its batch is one
 * script, and a message's counts span hash slots, which one script cannot.
 * (A queue's batches write them per slot before they occupy the marker:
 * cross-slot-counts.ts.)
 */
function messageScopeOnCluster(config: Pick<TallyConfig, 'prefix'>): MarkerFormatRefusedError {
  return new MarkerFormatRefusedError(
    `TALLY_SOURCE=stream on a Redis Cluster needs part-scoped markers, and prefix "${config.prefix}" is laid out (or asked) with message-scoped ones: ` +
      `a stream's batches are written in one script each, and on a cluster a message's counts span hash slots. ` +
      `Use a new TALLY_PREFIX (laid out with TALLY_MARKER_SCOPE=part by default here).`,
  );
}

/**
 * Atomic mode on a Redis Cluster, on a prefix two-step daemons laid out with
 * message-scoped markers without fenced adoption: its claims name no batch,
 * so a claim taken over could be counted twice, the double count atomic
 * mode exists to rule out.
 */
function unfencedOnCluster(config: Pick<TallyConfig, 'prefix'>, format: string): MarkerFormatRefusedError {
  return new MarkerFormatRefusedError(
    `TALLY_MODE=atomic on a Redis Cluster needs the ${FENCED_MESSAGE_MARKER_FORMAT} marker format (fenced adoption) for message-scoped markers, ` +
      `and prefix "${config.prefix}" was laid out by two-step daemons with ${format}, whose claims cannot be adopted without a double count. ` +
      `Run this prefix in two-step mode, or use a new TALLY_PREFIX (laid out for atomic mode by default).`,
  );
}
