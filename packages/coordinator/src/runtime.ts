/**
 * Composition: opens the daemon's edges in order, one opener each, every
 * opener adding its close steps to the daemon's CloseSteps as soon as what
 * it opened is open, so a start that fails halfway closes exactly what it
 * opened (close-steps.ts orders the close).
 *
 *   Redis (probe, client, health)      redis/open-redis.ts
 *   ─► fleet (layout check, heartbeat) fleet/open-fleet.ts
 *   ─► counters, exposure meter        telemetry/open-counters.ts
 *   ─► metrics and HTTP endpoint       telemetry/open-telemetry.ts
 *   ─► worker threads                  threads/open-threads.ts
 *   ─► message source (not started: the daemon starts it) and the pipeline
 */
import { IdWindow } from '@tally/shared';
import { PARTITION_RELEASED, type MessageSource, type SourceHandlers } from './amqp/message-source.js';
import { openSource } from './amqp/open-source.js';
import type { StreamSource } from './amqp/stream-source.js';
import { openFleet, type FleetEdge } from './fleet/open-fleet.js';
import { DeliveryPipeline } from './pipeline/delivery-pipeline.js';
import { checkNotInterrupted, type LiveViews, type StartContext, type Threads } from './process/start-context.js';
import { openRedis, type RedisEdge } from './redis/open-redis.js';
import { StreamState } from './stream/stream-state.js';
import { untilRedis } from './redis/until-redis.js';
import { openCounters, type CountersEdge } from './telemetry/open-counters.js';
import { openTelemetry, type Telemetry } from './telemetry/open-telemetry.js';
import { openThreads } from './threads/open-threads.js';

export { StartInterrupted, type DaemonOptions, type StartContext } from './process/start-context.js';

/** The daemon's edges, whole once openRuntime() returns them. */
export interface Runtime {
  readonly redis: RedisEdge;
  readonly fleet: FleetEdge;
  readonly counters: CountersEdge;
  readonly telemetry: Telemetry | null;
  readonly threads: Threads;
  readonly source: MessageSource;
}

/**
 * Opens every edge in order (a refused layout starts no thread), then the
 * pipeline between the source and the threads. A step that fails throws;
 * the caller closes what `closeSteps` holds by then.
 */
export async function openRuntime(context: StartContext): Promise<{ runtime: Runtime; pipeline: DeliveryPipeline }> {
  const { config, options } = context;
  const live: LiveViews = { pipeline: null, source: null };
  const redis = await openRedis(context);
  const fleet = await openFleet(context, redis, live);
  const counters = openCounters(context, redis, live);
  const telemetry = await openTelemetry(context, redis, counters, live);
  const threads = options.edges?.openThreads?.(context) ?? openThreads(context, redis, fleet.layout, counters);
  checkNotInterrupted(context);
  const handlers = sourceHandlers(context, live, fleet);
  // TALLY_SOURCE=stream: the watermarks and id windows the pipeline and the source share; a rollback a batch finds rewinds the source.
  const stream =
    config.source === 'stream'
      ? new StreamState({
          virtualShards: config.virtualShards,
          newWindow: () => (config.streamDedup ? new IdWindow({ ttlMs: config.markerTtlS * 1000 }) : null),
          onRollback: (partition, vshard, found, expected) => (live.source as StreamSource | null)?.rollback(partition, vshard, found, expected),
        })
      : null;
  const source = options.edges?.openSource?.(context, handlers) ?? openSource(context, handlers, { redis, counters, stream });
  // The prefix's recorded marker scope, not TALLY_MARKER_SCOPE: every daemon of a prefix must split messages alike.
  const pipeline = new DeliveryPipeline(
    { ...config, recordedMarkerScope: fleet.layout.markers.scope, injectBug: options.injectBug ?? null },
    {
      runner: threads,
      acker: source,
      deadLetters: source,
      counters: counters.stats,
      exposure: counters.exposure,
      metrics: telemetry?.metrics ?? null,
      log: context.log,
      ...(stream === null ? {} : { streamLog: stream }),
      ...(options.onBug === undefined ? {} : { onBug: options.onBug }),
    },
  );
  live.pipeline = pipeline;
  live.source = source;
  // The partitions to subscribe to as soon as the source connects, without waiting for the next beat.
  const { balancer } = fleet;
  if (balancer !== null) await untilRedis(context, 'partition assignment', () => balancer.rebalance());
  return { runtime: { redis, fleet, counters, telemetry, threads, source }, pipeline };
}

/** What the source tells the pipeline as deliveries and channels come and go. */
function sourceHandlers(context: StartContext, live: LiveViews, fleet: FleetEdge): SourceHandlers {
  const { log } = context;
  // The source is started only once the pipeline exists (Daemon.start), so no handler runs before it.
  const pipeline = () => live.pipeline!;
  return {
    onDelivery: (channel, message) => pipeline().accept(channel, message),
    unackedOn: (channel): number => pipeline().unackedOn(channel),
    onLinkUp: (channel) => {
      pipeline().channelUp(channel);
      // tally status shows the node a reconnect moved to now, not at the next beat.
      void fleet.heartbeat.beatOnce();
    },
    onLinkDown: (channel, reason) => {
      const unacked = pipeline().channelDown(channel);
      if (reason === PARTITION_RELEASED) {
        log.info({ partition: channel.partition, unacked, generation: channel.generation }, 'partition handed over');
        return;
      }
      // Closing the channel is the last step of a stop: only what is still unacked goes back.
      if (live.source?.closing === true || (context.stopping() && unacked === 0)) {
        if (unacked !== null && unacked > 0)
          log.warn({ unacked, generation: channel.generation }, 'channel closed with unacked deliveries; the broker redelivers them');
        else log.info({ generation: channel.generation }, 'channel closed');
        return;
      }
      log.warn({ reason, unacked, generation: channel.generation }, 'deliveries of the lost channel are left to redelivery');
    },
  };
}
