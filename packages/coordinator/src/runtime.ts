/**
 * Composition: builds the daemon's collaborators in order, each close step
 * added to the daemon's CloseSteps as soon as its collaborator is open, so a
 * start that fails halfway closes exactly what it opened.
 *
 *   Redis probe ─► Redis client, health ─► layout check ─► heartbeat ─► counters,
 *   exposure meter ─► metrics and HTTP endpoint ─► worker threads ─► delivery
 *   pipeline ─► RabbitMQ link (not started: the daemon starts it)
 */
import { metrics } from '@opentelemetry/api';
import type { MeterProvider } from '@opentelemetry/sdk-metrics';
import {
  describeError,
  describeRefusal,
  isServerRefusal,
  classifyError,
  isTallyError,
  defaultMarkerScope,
  MarkerFormatRefusedError,
  redactUrl,
  RedisRequirementError,
  retryUntilDone,
  RETRY_STOPPED,
  WindowGauge,
  type InjectedBug,
  type TallyConfig,
} from '@tally/shared';
import { createRedisClient, scanNodes, type RedisClient } from '@tally/runtime';
import { AmqpLink, PARTITION_RELEASED } from './amqp/amqp-link.js';
import type { BugHandler } from './process/bug-exit.js';
import { STEP_TIMEOUT_MS, type CloseStep, type CloseSteps } from './process/close-steps.js';
import { DEFAULT_SAMPLING, ExposureMeter } from './telemetry/exposure-meter.js';
import { Heartbeat, HEARTBEAT_TTL_BEATS, type HeartbeatSnapshot } from './fleet/heartbeat.js';
import { ensureLayout, ensurePartitionCount } from './fleet/layout-guard.js';
import { PartitionBalancer } from './fleet/partition-balancer.js';
import type { Logger } from './process/logger.js';
import { DeliveryPipeline } from './pipeline/delivery-pipeline.js';
import { RedisHealth } from './redis/redis-health.js';
import { probeRedis, type RedisProbeReport } from './redis/redis-probe.js';
import { startReplicaWatch, type ReplicaWatch } from './redis/replica-watch.js';
import { StatsRecorder } from './telemetry/stats-recorder.js';
import { HttpEndpoints } from './telemetry/http-endpoints.js';
import { DaemonMetrics } from './telemetry/metrics.js';
import { createMetricsExport, METER_NAME } from './telemetry/metrics-export.js';
import { registerSafetyGauges } from './telemetry/safety-gauges.js';
import { WorkerPools } from './threads/worker-pools.js';

/** The metrics side of the daemon, present when TALLY_METRICS_PORT is set. */
export interface Telemetry {
  readonly metrics: DaemonMetrics;
  readonly meterProvider: MeterProvider;
  readonly endpoints: HttpEndpoints;
  /** The port the HTTP endpoint listens on (TALLY_METRICS_PORT=0 picks one). */
  readonly port: number;
}

/** The daemon's collaborators, whole once openRuntime() returns them. */
export interface Runtime {
  /** What the start-up probe found (docs/redis-requirements.md). */
  readonly redisProbe: RedisProbeReport;
  /** Standalone or cluster client, as the probe found (redis-connection.ts). */
  readonly redis: RedisClient;
  /** Whether Redis refuses writes right now, as every writer sees it (redis-health.ts). */
  readonly health: RedisHealth;
  /** With TALLY_REDIS_WAIT_REPLICAS: the masters that cannot meet the WAIT (replica-watch.ts); null without. */
  readonly replicaWatch: ReplicaWatch | null;
  /** Renews this daemon's heartbeat key and the mode lease its layout check took. */
  readonly heartbeat: Heartbeat;
  readonly stats: StatsRecorder;
  /** What a crash would cost right now, integrated for `tally deviation`. */
  readonly exposure: ExposureMeter;
  readonly telemetry: Telemetry | null;
  readonly pools: WorkerPools;
  readonly link: AmqpLink;
}

/** What the composition needs from the daemon. */
export interface RuntimeContext {
  readonly config: TallyConfig;
  readonly log: Logger;
  /** This daemon's id in its heartbeat key and mode lease. */
  readonly daemonId: string;
  /** Names this daemon's two-step claims. */
  readonly claimToken: string;
  /** Where each collaborator's close step goes as soon as it is open. */
  readonly closeSteps: CloseSteps;
  /** True once a stop came while the daemon was starting: the start gives up at its next step. */
  interrupted(): boolean;
  /** Whether the daemon is stopping: a channel closing then is the stop, not a loss. */
  stopping(): boolean;
  /** What /readyz answers. */
  readyz(): { ready: boolean; detail: Record<string, unknown> };
  /** What main.ts gives the daemon besides its configuration: the bug handler and fault injection. */
  readonly options: DaemonOptions;
}

/** What main.ts gives the daemon besides its configuration. */
export interface DaemonOptions {
  /**
   * Told of a bug met on the batch or delivery path (bug-exit.ts): main.ts
   * logs it and exits 70. By default the error is rethrown.
   */
  readonly onBug?: BugHandler;
  /** TALLY_FAULT_BUG=main (config.ts loadFaultInjection): each delivery makes the ack tracker throw. */
  readonly injectBug?: InjectedBug | null;
}

/** A stop came while the daemon was starting: what was opened is closed, the start ends without running. */
export class StartInterrupted extends Error {
  constructor() {
    super('start interrupted by a stop');
    this.name = 'StartInterrupted';
  }
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

/**
 * Builds the collaborators in order: Redis and the layout check first (a
 * refused layout starts no thread), then the counters, metrics, threads,
 * the pipeline and the link. A step that fails throws; the caller closes
 * what `closeSteps` holds by then.
 */
export async function openRuntime(context: RuntimeContext): Promise<{ runtime: Runtime; pipeline: DeliveryPipeline }> {
  const { config, log, closeSteps } = context;
  const checkpoint = () => {
    if (context.interrupted()) throw new StartInterrupted();
  };
  // Before anything is written: a Redis that cannot keep Tally's promise stops the start here.
  const redisProbe = await untilRedis(context, 'redis probe', () => probeRedis(config, log));
  checkpoint();
  const redis = createRedisClient(config.redisUrl, 'tally-coordinator', {}, redisProbe.topology);
  if (redisProbe.topology === 'cluster') log.info({ masters: redisProbe.masters }, 'redis cluster detected: one slot per virtual shard');
  redis.on('error', () => {});
  redis.on('ready', () => log.info({ redis: redactUrl(config.redisUrl) }, 'redis ready'));
  redis.on('end', () => log.warn('redis connection ended'));
  closeSteps.add(closeRedisStep(redis));
  const health = new RedisHealth(log);
  const replicaWatch = startReplicaWatch(redis, config, log);
  if (replicaWatch !== null) closeSteps.add({ name: 'stopping the replica watch', run: () => replicaWatch.stop() });

  const lease = { holder: context.daemonId, ttlMs: HEARTBEAT_TTL_BEATS * config.heartbeatMs };
  // Before the layout is recorded: a new prefix must not be laid out with a scope this Redis cannot serve.
  if (config.markerScope === 'message' && redisProbe.topology === 'cluster') throw messageScopeOnCluster(config.prefix);
  const proposedScope = config.markerScope ?? defaultMarkerScope(redisProbe.topology);
  const layout = await untilRedis(context, 'layout check', () => ensureLayout(redis, { ...config, markerScope: proposedScope }, lease));
  checkpoint();
  log.info({ virtualShards: layout.virtualShards, created: layout.created, daemonId: context.daemonId, markers: layout.markers }, 'shard layout verified');
  if (layout.markers.scope === 'message' && redisProbe.topology === 'cluster') throw messageScopeOnCluster(config.prefix);
  // Recorded like the virtual shards: daemons of another TALLY_PARTITIONS would compute other owners (docs/operations.md).
  await untilRedis(context, 'partition count check', () => ensurePartitionCount(redis, config.prefix, config.partitions));
  checkpoint();
  if (config.markerScope !== null && layout.markers.scope !== config.markerScope) {
    log.warn(
      { configured: config.markerScope, recorded: layout.markers.scope },
      'TALLY_MARKER_SCOPE differs from the scope the prefix was laid out with; using the recorded one (every daemon of a prefix must)',
    );
  }

  // The pipeline and the link are built last (they need the meter, the
  // metrics and the threads), but the heartbeat, the meter and the gauges
  // read their figures from the start: through these, null until then.
  let pipeline: DeliveryPipeline | null = null;
  let link: AmqpLink | null = null;
  const partitioned = config.partitions > 1;
  // TALLY_PARTITIONS > 1: after every beat, the partitions this daemon owns among the live ones.
  const balancer = partitioned
    ? new PartitionBalancer(
        { prefix: config.prefix, queue: config.queue, partitions: config.partitions, selfId: context.daemonId },
        () => scanNodes(redis),
        (partitions) => {
          link?.assign(partitions);
          // Three beats without a delivery over a queue with ready messages: subscribe again (amqp-link.ts says why).
          void link?.checkIdlePartitions(3 * config.heartbeatMs).catch((error) => log.warn({ err: describeError(error) }, 'idle partition check failed'));
        },
        () => context.stopping(),
        log,
      )
    : null;

  // From the layout check on, not from the link: the beat renews the mode lease the check took (layout-guard.ts).
  const heartbeat = new Heartbeat(
    redis,
    context.daemonId,
    {
      prefix: config.prefix,
      mode: config.mode,
      queue: config.queue,
      intervalMs: config.heartbeatMs,
      ttlMs: lease.ttlMs,
      partitions: config.partitions,
      ...(balancer === null ? {} : { afterBeat: () => balancer.rebalance() }),
    },
    (): HeartbeatSnapshot => {
      const ageMs = pipeline?.oldestUnackedAgeMs() ?? null;
      return {
        consuming: link?.consuming ?? false,
        oldestUnackedS: ageMs === null ? null : ageMs / 1000,
        inFlight: pipeline?.unacked ?? 0,
        amqpNode: link?.node ?? null,
        ...(partitioned ? { partitions: link?.partitionsHeld ?? [], leaving: context.stopping() } : {}),
      };
    },
    log,
  );
  heartbeat.start();
  closeSteps.add({ name: 'stopping the heartbeat', timeoutMs: 500, run: () => heartbeat.stop() });

  const stats = new StatsRecorder(redis, config.prefix, log, (error) => {
    if (error === null || error === undefined) health.recovered('stats flush');
    else {
      const refusal = describeRefusal(error);
      if (isServerRefusal(refusal.failureClass)) health.refused('stats flush', refusal.errorType, refusal.failureClass, refusal.message);
    }
  });
  stats.start();
  // Two-step mode's worker threads mark which messages sit in a crash window; the meter reads it.
  const windowGauge = config.mode === 'two-step' ? WindowGauge.create(config.virtualShards) : null;
  const exposure = new ExposureMeter(
    stats,
    () => (pipeline?.unacked ?? 0) * 2 >= config.prefetch,
    windowGauge === null ? null : () => windowGauge.messages(),
    DEFAULT_SAMPLING,
    windowGauge,
  );
  exposure.start();
  closeSteps.add({
    name: 'final stats flush',
    timeoutMs: STEP_TIMEOUT_MS,
    run: () => {
      exposure.stop();
      stats.stop();
      return stats.flush();
    },
  });

  const telemetry = await startTelemetry(context, stats, redis, redisProbe, health, replicaWatch, {
    unacked: () => pipeline?.unacked ?? 0,
    laneDepths: () => pipeline?.laneDepths() ?? [],
    oldestUnackedAgeMs: () => pipeline?.oldestUnackedAgeMs() ?? null,
    link: () => link,
    channels: () => pipeline?.channels() ?? [],
  });
  if (telemetry !== null) closeSteps.add({ name: 'closing the metrics endpoint', timeoutMs: 500, run: () => closeTelemetry(telemetry) });
  checkpoint();

  const pools = new WorkerPools(
    {
      redisUrl: config.redisUrl,
      redisTopology: redisProbe.topology,
      prefix: config.prefix,
      mode: config.mode,
      markerTtlS: config.markerTtlS,
      countTtlS: config.countTtlS,
      logLevel: config.logLevel,
      markerBucketS: layout.markers.bucketS,
      markerSubBuckets: layout.markers.subBuckets,
      markerScope: layout.markers.scope,
      virtualShards: config.virtualShards,
      claimToken: context.claimToken,
      claimTtlMs: config.markerClaimTtlS * 1000,
      ...(windowGauge === null ? {} : { windowGauge: windowGauge.buffer }),
      waitReplicas: config.redisWaitReplicas,
      waitTimeoutMs: config.redisWaitTimeoutMs,
    },
    config.workers,
    config.virtualShards,
    // Taken as they happen: a WAIT that keeps timing out holds its batch, and a
    // Redis that refuses a batch step makes it retry quietly; both must show meanwhile.
    (event) => {
      if (event.type === 'wait-timeout') {
        stats.add('wait_timeouts');
        replicaWatch?.nudge();
      } else health.apply(event.health);
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

  const amqp = new AmqpLink(
    {
      nodes: config.amqpNodes,
      queue: config.queue,
      deadLetterQueue: config.deadLetterQueue,
      prefetch: config.prefetch,
      queueType: config.queueType,
      deliveryLimit: config.deliveryLimit,
      partitions: config.partitions,
    },
    log,
    {
      onDelivery: (channel, message) => delivery.accept(channel, message),
      unackedOn: (channel): number => delivery.unackedOn(channel),
      onLinkUp: (channel) => {
        delivery.channelUp(channel);
        // tally status shows the node a reconnect moved to now, not at the next beat.
        void heartbeat.beatOnce();
      },
      onLinkDown: (channel, reason) => {
        const unacked = delivery.channelDown(channel);
        if (reason === PARTITION_RELEASED) {
          log.info({ partition: channel.partition, unacked, generation: channel.generation }, 'partition handed over');
          return;
        }
        // Closing the channel is the last step of a stop: only what is still unacked goes back.
        if (amqp.closing || (context.stopping() && unacked === 0)) {
          if (unacked !== null && unacked > 0)
            log.warn({ unacked, generation: channel.generation }, 'channel closed with unacked deliveries; the broker redelivers them');
          else log.info({ generation: channel.generation }, 'channel closed');
          return;
        }
        log.warn({ reason, unacked, generation: channel.generation }, 'deliveries of the lost channel are left to redelivery');
      },
    },
  );
  // The prefix's recorded marker scope, not TALLY_MARKER_SCOPE: every daemon of a prefix must split messages alike.
  const delivery = new DeliveryPipeline(
    { ...config, recordedMarkerScope: layout.markers.scope, injectBug: context.options.injectBug ?? null },
    {
      runner: pools,
      acker: amqp,
      deadLetters: amqp,
      counters: stats,
      exposure,
      metrics: telemetry?.metrics ?? null,
      log,
      ...(context.options.onBug === undefined ? {} : { onBug: context.options.onBug }),
    },
  );
  closeSteps.add({ name: 'closing amqp', timeoutMs: STEP_TIMEOUT_MS + 100, run: () => amqp.close(STEP_TIMEOUT_MS) });
  pipeline = delivery;
  link = amqp;
  // The partitions to subscribe to as soon as the link connects, without waiting for the next beat.
  if (balancer !== null) await untilRedis(context, 'partition assignment', () => balancer.rebalance());
  return { runtime: { redisProbe, redis, health, replicaWatch, heartbeat, stats, exposure, telemetry, pools, link: amqp }, pipeline: delivery };
}

/** Message-scoped markers on a Redis Cluster: a message's counts span hash slots, so no script can write them with its one marker. */
function messageScopeOnCluster(prefix: string): MarkerFormatRefusedError {
  return new MarkerFormatRefusedError(
    `TALLY_MARKER_SCOPE=message needs a standalone Redis, and this one is a cluster (prefix "${prefix}"): a message's counts span hash slots, ` +
      `so they cannot be written with its one marker. Use TALLY_MARKER_SCOPE=part (the default on a cluster) with a new TALLY_PREFIX.`,
  );
}

/** The pipeline's and the link's figures, for the gauges: read at each scrape, null or empty before they exist. */
interface LiveFigures {
  unacked(): number;
  laneDepths(): number[];
  oldestUnackedAgeMs(): number | null;
  link(): AmqpLink | null;
  channels(): ReturnType<DeliveryPipeline['channels']>;
}

/** Metrics and the HTTP endpoint, when TALLY_METRICS_PORT is set. */
async function startTelemetry(
  context: RuntimeContext,
  stats: StatsRecorder,
  redis: RedisClient,
  redisProbe: RedisProbeReport,
  health: RedisHealth,
  replicaWatch: ReplicaWatch | null,
  live: LiveFigures,
): Promise<Telemetry | null> {
  const { config, log } = context;
  if (config.metricsPort === null) return null;
  const { exporter, provider: meterProvider, histograms } = await createMetricsExport();
  metrics.setGlobalMeterProvider(meterProvider);
  const daemonMetrics = new DaemonMetrics(
    meterProvider.getMeter(METER_NAME),
    { queue: config.queue, mode: config.mode, virtualShards: config.virtualShards },
    {
      counters: () => stats.sinceStart,
      inFlight: () => live.unacked(),
      shardDepths: () => live.laneDepths(),
      connections: () => ({ amqp: (live.link()?.current ?? null) !== null, redis: redis.status === 'ready' }),
      // The one source of this figure, also in the heartbeat and /readyz's stall: the AckTracker's lowest unacked tag.
      oldestUnackedAgeSeconds: () => (live.oldestUnackedAgeMs() ?? 0) / 1000,
      ...(config.partitions > 1
        ? { partitions: { configured: config.partitions, held: () => live.link()?.partitionsHeld ?? [], channels: () => live.channels() } }
        : {}),
      redisRefusals: health,
    },
    histograms,
  );
  registerSafetyGauges(
    meterProvider.getMeter(METER_NAME),
    { 'messaging.system': 'rabbitmq', 'messaging.destination.name': config.queue },
    {
      redisProbe: () => redisProbe,
      amqpBlocked: () => live.link()?.brokerState.blocked ?? false,
      unroutableDeadLetters: () => live.link()?.brokerState.unroutableDeadLetters ?? 0,
      ...(replicaWatch === null ? {} : { replicasShort: () => replicaWatch.shortfallByMaster() }),
    },
  );
  const endpoints = new HttpEndpoints(exporter, () => context.readyz());
  const port = await endpoints.listen(config.metricsPort, config.metricsHost);
  log.info({ host: config.metricsHost, port, paths: ['/metrics', '/healthz', '/readyz'] }, 'http endpoint listening');
  return { metrics: daemonMetrics, meterProvider, endpoints, port };
}

async function closeTelemetry(telemetry: Telemetry): Promise<void> {
  await telemetry.endpoints.close();
  await telemetry.meterProvider.shutdown();
}

/** Startup steps wait for Redis like everything else (invariant 8), but fatal errors still stop the start. */
async function untilRedis<T>(context: RuntimeContext, what: string, step: () => Promise<T>): Promise<T> {
  let outcome: T | typeof RETRY_STOPPED;
  try {
    outcome = await retryUntilDone(step, {
      // Outages wait (invariant 8); a refusal no retry can fix (an ACL that
      // forbids a command, a wrong password) stops the start with one line
      // naming it instead of looping on "redis unavailable".
      giveUp: (failureClass, error) => isTallyError(error) || failureClass === 'fatal',
      // A stop while Redis is away ends the wait: the process is on its way out.
      stopWhen: () => context.interrupted(),
      onAttemptFailed: ({ error, attempt, delayMs, failureClass }) =>
        context.log.warn({ what, attempt, delayMs, failureClass, err: describeError(error) }, 'redis unavailable; retrying'),
    });
  } catch (error) {
    if (isTallyError(error) || classifyError(error) === 'bug') throw error;
    throw new RedisRequirementError(
      'TALLY_REDIS_NOPERM',
      `Redis refused the ${what}: ${describeError(error)}; grant the user what docs/redis-requirements.md lists (ACL SETUSER <user> ~<TALLY_PREFIX>* +@read +@write +@scripting +@connection +info +time)`,
    );
  }
  if (outcome === RETRY_STOPPED) throw new StartInterrupted();
  return outcome;
}
