/**
 * The daemon's lifecycle and the path of one delivery:
 *
 *   delivery -> parse -> (bad: dead-letter, ack) -> split by virtual shard
 *            -> hold if the same id is in flight -> shard lanes -> worker thread
 *            -> every part reported done -> ack (contiguous multiple-ack)
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { metrics, trace, type Tracer } from '@opentelemetry/api';
import type { MeterProvider } from '@opentelemetry/sdk-metrics';
import type { ConsumeMessage } from 'amqplib';
import {
  PART_DONE,
  PART_HELD,
  classifyError,
  describeError,
  encodeBatchTask,
  WindowGauge,
  describeRefusal,
  formatReason,
  isServerRefusal,
  isTallyError,
  markerDigest,
  deliveryParser,
  redactUrl,
  RedisRequirementError,
  retryUntilDone,
  RETRY_STOPPED,
  splitByShard,
  wholeMessagePart,
  markerShardOf,
  MarkerFormatRefusedError,
  type MarkerScope,
  COUNT_REFUSED,
  type BatchResult,
  type CountRefusal,
  type InjectedBug,
  type DeliveryParser,
  type TallyConfig,
} from '@tally/shared';
import { createRedisClient, type RedisClient } from '@tally/runtime';
import { AckTracker } from './ack-tracker.js';
import { AmqpLink, type AmqpBrokerState } from './amqp-link.js';
import type { BugHandler } from './bug-exit.js';
import type { ChannelLink, Delivery } from './delivery.js';
import { ensureLayout } from './layout-guard.js';
import { probeRedis, type RedisProbeReport } from './redis-probe.js';
import { Heartbeat, HEARTBEAT_TTL_BEATS, newDaemonId, type HeartbeatSnapshot } from './heartbeat.js';
import type { Logger } from './logger.js';
import { ShardLanes, type PendingPart } from './shard-lanes.js';
import { StatsRecorder } from './stats-recorder.js';
import { WorkerPools } from './worker-pools.js';
import { BadMessageLog } from './bad-message-log.js';
import { runIsolating } from './batch-isolation.js';
import { DEFAULT_SAMPLING, ExposureMeter } from './exposure-meter.js';
import { within, TIMED_OUT } from './deadline.js';
import { judgeReadiness, type ReadinessVerdict } from './readiness.js';
import { startReplicaWatch, type ReplicaWatch } from './replica-watch.js';
import { RedisHealth } from './redis-health.js';
import { endBatchSpan, failBatchSpan, recordDeadLetter, startBatchSpan } from './telemetry/batch-span.js';
import { HttpEndpoints } from './telemetry/http-endpoints.js';
import { registerSafetyGauges } from './telemetry/safety-gauges.js';
import { DaemonMetrics, timestampToMs } from './telemetry/metrics.js';
import { createMetricsExport, METER_NAME } from './telemetry/metrics-export.js';

/** How long a part held by another daemon's claim waits before it is tried again. */
const CLAIM_RETRY_MS = 200;

export type DaemonState = 'created' | 'starting' | 'running' | 'stopping' | 'stopped';

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

/** The metrics side of the daemon, present when TALLY_METRICS_PORT is set. */
interface Telemetry {
  readonly metrics: DaemonMetrics;
  readonly meterProvider: MeterProvider;
  readonly endpoints: HttpEndpoints;
  /** The port the HTTP endpoint listens on (TALLY_METRICS_PORT=0 picks one). */
  readonly port: number;
}

/**
 * The daemon's collaborators, built once by start() and whole from then on:
 * the Redis client, the counters, the worker threads, the shard lanes and
 * the RabbitMQ link.
 */
interface Runtime {
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
  readonly lanes: ShardLanes;
  readonly link: AmqpLink;
}

/**
 * One step of a shutdown: run in order, each on its own, a failure logged by
 * name and the next one run anyway. A step with `timeoutMs` is waited for at
 * most that long (and never past the stop's closing deadline); `force` then
 * cuts what it was waiting for.
 */
interface ShutdownStep {
  readonly name: string;
  run(): unknown;
  readonly timeoutMs?: number;
  force?(): void;
}

/**
 * Time the closing steps may take after the grace period, in total. Every
 * step that waits on a server is bounded by it, so a stop ends within
 * TALLY_SHUTDOWN_GRACE_MS plus this whatever Redis or RabbitMQ do; main.ts's
 * backstop (SHUTDOWN_MARGIN_MS) is a little longer still.
 */
export const CLOSE_BUDGET_MS = 2_500;
/** The most one closing step waits for its server. */
const STEP_TIMEOUT_MS = 1_000;

async function runSteps(steps: readonly ShutdownStep[], log: Logger, progress: (step: string | null) => void, deadlineAt = Infinity): Promise<void> {
  for (const step of steps) {
    progress(step.name);
    try {
      const work = Promise.resolve().then(() => step.run());
      if (step.timeoutMs === undefined) await work;
      else {
        const budget = Math.max(0, Math.min(step.timeoutMs, deadlineAt - performance.now()));
        if ((await within(budget, work)) === TIMED_OUT) {
          log.warn({ step: step.name, waitedMs: Math.round(budget) }, `${step.name}: no answer in time; going on`);
          step.force?.();
        }
      }
    } catch (error) {
      log.warn({ step: step.name, err: describeError(error) }, `${step.name} failed`);
    }
  }
  progress(null);
}

/** QUIT, or a plain disconnect when the server does not answer it in time (a hung Redis never would). */
function closeRedisStep(redis: RedisClient): ShutdownStep {
  return {
    name: 'closing redis',
    timeoutMs: 500,
    run: () => redis.quit().catch(() => redis.disconnect()),
    force: () => redis.disconnect(),
  };
}

export class Daemon {
  private state: DaemonState = 'created';
  /** Null until start() has built it; never partly built. */
  private built: Runtime | null = null;
  private readonly badLog: BadMessageLog;
  /** Ack bookkeeping of the live channel; replaced on every reconnect. */
  private acks: { link: ChannelLink; tracker: AckTracker } | null = null;
  private ackScheduled = false;
  /** Checks for a stalled head (invariant 10); runs while the daemon does. */
  private stallTimer: NodeJS.Timeout | null = null;
  /** Since when (epoch ms) the head has been stalled and single acks are going out; null when it is not. */
  private stalledSince: number | null = null;
  /** The shutdown step running now, for main.ts's backstop to name. */
  private stopStep: string | null = null;
  /** Message ids with parts in flight: a second delivery of one waits for the first. */
  private readonly messagesInProgress = new Map<string, Delivery>();
  /** Dead-letter publishes not yet confirmed (or given up with their channel). */
  private readonly pendingDeadLetters = new Set<Promise<void>>();
  private stopping: Promise<void> | null = null;
  private readonly tracer: Tracer = trace.getTracer('tally.coordinator');
  /** The contract's shape, or TALLY_MESSAGE_MAPPING's: chosen once, at start. */
  private readonly parseDelivery: DeliveryParser;
  /** This daemon's id in its heartbeat key and mode lease. */
  readonly daemonId = newDaemonId();
  /** What one marker stands for on this prefix, as its layout records it (set by the layout check, before the first delivery). */
  private markerScope: MarkerScope = 'part';
  /** Names this daemon's two-step claims (new at every start: a restarted daemon waits out its predecessor's claims like anyone's). */
  private readonly claimToken = randomBytes(8).toString('hex');
  /** A bug was met (invariant 13): no ack goes out any more, whatever finishes. */
  private halted = false;

  constructor(
    private readonly config: TallyConfig,
    private readonly log: Logger,
    private readonly options: DaemonOptions = {},
  ) {
    this.badLog = new BadMessageLog(log);
    this.parseDelivery = deliveryParser(config.messageMapping, Object.freeze({ maxBytes: config.maxMessageBytes }));
  }

  /**
   * The collaborators, for the paths that only run once start() built them:
   * deliveries, batches and acks all come from the link it opened.
   */
  private get runtime(): Runtime {
    if (this.built === null) throw new Error(`daemon used in state ${this.state} before start() built its runtime`);
    return this.built;
  }

  /** The port the HTTP endpoint listens on, once started (TALLY_METRICS_PORT=0 picks one). */
  get metricsPort(): number | null {
    return this.built?.telemetry?.port ?? null;
  }

  get status(): {
    state: DaemonState;
    consuming: boolean;
    redisReady: boolean;
    /** Messages with parts not yet written (tally_deliveries_in_flight counts deliveries not yet acked: a written one waits for its ack). */
    messagesInProgress: number;
    oldestUnackedS: number | null;
    redis: RedisProbeReport | null;
    amqp: AmqpBrokerState | null;
  } {
    const ageMs = this.acks?.tracker.oldestUnackedAgeMs() ?? null;
    return {
      state: this.state,
      consuming: this.built?.link.consuming ?? false,
      redisReady: this.built?.redis.status === 'ready',
      messagesInProgress: this.messagesInProgress.size,
      oldestUnackedS: ageMs === null ? null : Math.round(ageMs) / 1000,
      redis: this.built?.redisProbe ?? null,
      amqp: this.built?.link.brokerState ?? null,
    };
  }

  /** What /readyz answers: running, connected, consuming, Redis accepting writes, no stalled head (readiness.ts). */
  get readiness(): ReadinessVerdict {
    const status = this.status;
    return judgeReadiness({
      state: status.state,
      consuming: status.consuming,
      redisConnected: status.redisReady,
      refusal: this.built?.health.current() ?? null,
      replicasShort: this.built?.replicaWatch?.short ?? [],
      oldestUnackedMs: this.acks?.tracker.oldestUnackedAgeMs() ?? null,
      stallMs: this.config.stallMs,
      nowMs: Date.now(),
    });
  }

  get ready(): boolean {
    return this.readiness.ready;
  }

  /** The shutdown step running now (null before and after the stop): what main.ts's backstop names. */
  get pendingStopStep(): string | null {
    return this.stopStep;
  }

  async start(): Promise<void> {
    if (this.state !== 'created') throw new Error(`start() called in state ${this.state}`);
    this.state = 'starting';
    const { config, log } = this;
    log.info(
      {
        amqp: redactUrl(config.amqpUrl),
        redis: redactUrl(config.redisUrl),
        queue: config.queue,
        prefix: config.prefix,
        mode: config.mode,
        workers: config.workers,
        virtualShards: config.virtualShards,
        prefetch: config.prefetch,
        batchSize: config.batchSize,
        batchMaxChanges: config.batchMaxChanges,
        batchWaitMs: config.batchWaitMs,
        markerTtlS: config.markerTtlS,
        acceptTypes: config.acceptTypes ? [...config.acceptTypes] : 'all',
      },
      'starting',
    );
    this.built = await this.openRuntime();
    // Threads ready before the first delivery: no prefetch window held while they start.
    await this.built.pools.warm();
    await this.built.link.start();
    this.state = 'running';
    // Often enough to ack behind a stalled head within a second of the threshold; cheap when nothing stalls.
    this.stallTimer = setInterval(() => this.sendAcks(), Math.min(1_000, Math.max(50, this.config.stallMs / 4)));
    this.stallTimer.unref();
    void this.built.heartbeat.beatOnce(); // show "consuming" now, not at the next interval
  }

  private heartbeatSnapshot(): HeartbeatSnapshot {
    const tracker = this.acks?.tracker;
    const ageMs = tracker?.oldestUnackedAgeMs() ?? null;
    return {
      consuming: this.built?.link.consuming ?? false,
      oldestUnackedS: ageMs === null ? null : ageMs / 1000,
      inFlight: tracker?.unacked ?? 0,
      amqpNode: this.built?.link.node ?? null,
    };
  }

  /**
   * Builds the collaborators in order: Redis and the layout check first (a
   * refused layout starts no thread), then the counters, metrics, threads,
   * lanes and the link. If a step fails, what was opened so far is closed.
   */
  private async openRuntime(): Promise<Runtime> {
    const { config, log } = this;
    // Before anything is written: a Redis that cannot keep Tally's promise stops the start here.
    const redisProbe = await this.untilRedis('redis probe', () => probeRedis(config, log));
    const redis = createRedisClient(config.redisUrl, 'tally-coordinator', {}, redisProbe.topology);
    if (redisProbe.topology === 'cluster') log.info({ masters: redisProbe.masters }, 'redis cluster detected: one slot per virtual shard');
    redis.on('error', () => {});
    redis.on('ready', () => log.info({ redis: redactUrl(config.redisUrl) }, 'redis ready'));
    redis.on('end', () => log.warn('redis connection ended'));
    const opened: ShutdownStep[] = [closeRedisStep(redis)];
    const health = new RedisHealth(log);
    health.listen();
    opened.push({ name: 'closing the health channel', run: () => health.close() });
    const replicaWatch = startReplicaWatch(redis, config, log);
    if (replicaWatch !== null) opened.push({ name: 'stopping the replica watch', run: () => replicaWatch.stop() });
    try {
      const lease = { holder: this.daemonId, ttlMs: HEARTBEAT_TTL_BEATS * config.heartbeatMs };
      // Before the layout is recorded: a new prefix must not be laid out with a scope this Redis cannot serve.
      if (config.markerScope === 'message' && redisProbe.topology === 'cluster') throw messageScopeOnCluster(config.prefix);
      const layout = await this.untilRedis('layout check', () => ensureLayout(redis, config, lease));
      log.info({ virtualShards: layout.virtualShards, created: layout.created, daemonId: this.daemonId, markers: layout.markers }, 'shard layout verified');
      if (layout.markers.scope === 'message' && redisProbe.topology === 'cluster') throw messageScopeOnCluster(config.prefix);
      if (layout.markers.scope !== config.markerScope) {
        log.warn(
          { configured: config.markerScope, recorded: layout.markers.scope },
          'TALLY_MARKER_SCOPE differs from the scope the prefix was laid out with; using the recorded one (every daemon of a prefix must)',
        );
      }
      this.markerScope = layout.markers.scope;
      // From the layout check on, not from the link: the beat renews the mode lease the check took (layout-guard.ts).
      const heartbeat = new Heartbeat(
        redis,
        this.daemonId,
        { prefix: config.prefix, mode: config.mode, queue: config.queue, intervalMs: config.heartbeatMs, ttlMs: lease.ttlMs },
        () => this.heartbeatSnapshot(),
        log,
      );
      heartbeat.start();
      opened.unshift({ name: 'stopping the heartbeat', run: () => heartbeat.stop() });

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
        () => (this.acks?.tracker.unacked ?? 0) * 2 >= config.prefetch,
        windowGauge === null ? null : () => windowGauge.messages(),
        DEFAULT_SAMPLING,
        windowGauge,
      );
      exposure.start();
      opened.unshift({
        name: 'final stats flush',
        run: () => {
          exposure.stop();
          stats.stop();
          return stats.flush();
        },
      });
      const telemetry = await this.startMetrics(stats, redis, redisProbe, health, replicaWatch);
      if (telemetry !== null) opened.unshift({ name: 'closing the metrics endpoint', run: () => closeTelemetry(telemetry) });

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
          claimToken: this.claimToken,
          claimTtlMs: config.markerClaimTtlS * 1000,
          ...(windowGauge === null ? {} : { windowGauge: windowGauge.buffer }),
          waitReplicas: config.redisWaitReplicas,
          waitTimeoutMs: config.redisWaitTimeoutMs,
        },
        config.workers,
        config.virtualShards,
        // Counted as they happen: a WAIT that keeps timing out holds its batch, and the stall must show meanwhile.
        (event) => {
          if (event.type === 'wait-timeout') {
            stats.add('wait_timeouts');
            replicaWatch?.nudge();
          }
        },
      );
      // A batch retries every server failure itself: whatever escapes it is a bug (invariant 13).
      const lanes = new ShardLanes(config, (vshard, parts) => this.runBatch(vshard, parts).catch((error: unknown) => this.bug(error, 'batch')));
      const link = new AmqpLink(
        {
          nodes: config.amqpNodes,
          queue: config.queue,
          deadLetterQueue: config.deadLetterQueue,
          prefetch: config.prefetch,
          queueType: config.queueType,
          deliveryLimit: config.deliveryLimit,
        },
        log,
        {
          // Thrown inside amqplib's frame loop, a bug would read as a broken connection and be retried as an outage.
          onDelivery: (link, message) => {
            try {
              this.onDelivery(link, message);
            } catch (error) {
              this.bug(error, 'delivery');
            }
          },
          onLinkUp: (link) => {
            this.acks = { link, tracker: new AckTracker() };
            exposure.channelChanged(link);
            // tally status shows the node a reconnect moved to now, not at the next beat.
            void heartbeat.beatOnce();
          },
          onLinkDown: (link, reason) => {
            const unacked = this.acks?.link === link ? this.acks.tracker.unacked : null;
            if (this.acks?.link === link) this.acks = null;
            // Closing the channel is the last step of a stop: only what is still unacked goes back.
            if (this.built?.link.closing === true || (this.state === 'stopping' && unacked === 0)) {
              if (unacked !== null && unacked > 0)
                log.warn({ unacked, generation: link.generation }, 'channel closed with unacked deliveries; the broker redelivers them');
              else log.info({ generation: link.generation }, 'channel closed');
              return;
            }
            log.warn({ reason, unacked, generation: link.generation }, 'deliveries of the lost channel are left to redelivery');
          },
        },
      );
      return { redisProbe, redis, health, replicaWatch, heartbeat, stats, exposure, telemetry, pools, lanes, link };
    } catch (error) {
      await runSteps(opened, log, () => {});
      throw error;
    }
  }

  /** Metrics and the HTTP endpoint, when TALLY_METRICS_PORT is set. */
  private async startMetrics(
    stats: StatsRecorder,
    redis: RedisClient,
    redisProbe: RedisProbeReport,
    health: RedisHealth,
    replicaWatch: ReplicaWatch | null = null,
  ): Promise<Telemetry | null> {
    const { config } = this;
    if (config.metricsPort === null) return null;
    const { exporter, provider: meterProvider, histograms } = await createMetricsExport();
    metrics.setGlobalMeterProvider(meterProvider);
    const daemonMetrics = new DaemonMetrics(
      meterProvider.getMeter(METER_NAME),
      { queue: config.queue, mode: config.mode, virtualShards: config.virtualShards },
      {
        counters: () => stats.sinceStart,
        inFlight: () => this.acks?.tracker.unacked ?? 0,
        // Lanes and link exist once start() has built the runtime; a scrape before that sees none.
        shardDepths: () => this.built?.lanes.depths() ?? [],
        connections: () => ({ amqp: (this.built?.link.current ?? null) !== null, redis: redis.status === 'ready' }),
        // The one source of this figure, also in the heartbeat and /readyz's stall: the AckTracker's lowest unacked tag.
        oldestUnackedAgeSeconds: () => (this.acks?.tracker.oldestUnackedAgeMs() ?? 0) / 1000,
        redisRefusals: health,
      },
      histograms,
    );
    registerSafetyGauges(
      meterProvider.getMeter(METER_NAME),
      { 'messaging.system': 'rabbitmq', 'messaging.destination.name': config.queue },
      {
        redisProbe: () => redisProbe,
        amqpBlocked: () => this.built?.link.brokerState.blocked ?? false,
        unroutableDeadLetters: () => this.built?.link.brokerState.unroutableDeadLetters ?? 0,
        ...(replicaWatch === null ? {} : { replicasShort: () => replicaWatch.shortfallByMaster() }),
      },
    );
    const endpoints = new HttpEndpoints(exporter, () => {
      const verdict = this.readiness;
      return { ready: verdict.ready, detail: { reason: verdict.reason, since: verdict.since, ...this.status } };
    });
    const port = await endpoints.listen(config.metricsPort, config.metricsHost);
    this.log.info({ host: config.metricsHost, port, paths: ['/metrics', '/healthz', '/readyz'] }, 'http endpoint listening');
    return { metrics: daemonMetrics, meterProvider, endpoints, port };
  }

  /** Startup steps wait for Redis like everything else (invariant 8), but fatal errors still stop the start. */
  private async untilRedis<T>(what: string, step: () => Promise<T>): Promise<T> {
    try {
      return await this.retryRedis(what, step);
    } catch (error) {
      if (isTallyError(error) || classifyError(error) === 'bug') throw error;
      throw new RedisRequirementError(
        'TALLY_REDIS_NOPERM',
        `Redis refused the ${what}: ${describeError(error)}; grant the user what docs/redis-requirements.md lists (ACL SETUSER <user> ~<TALLY_PREFIX>* +@read +@write +@scripting +@connection +info +time)`,
      );
    }
  }

  private retryRedis<T>(what: string, step: () => Promise<T>): Promise<T> {
    return retryUntilDone(step, {
      // Outages wait (invariant 8); a refusal no retry can fix (an ACL that
      // forbids a command, a wrong password) stops the start with one line
      // naming it instead of looping on "redis unavailable".
      giveUp: (failureClass, error) => isTallyError(error) || failureClass === 'fatal',
      onAttemptFailed: ({ error, attempt, delayMs, failureClass }) =>
        this.log.warn({ what, attempt, delayMs, failureClass, err: describeError(error) }, 'redis unavailable; retrying'),
    });
  }

  private onDelivery(link: ChannelLink, message: ConsumeMessage): void {
    const acks = this.acks;
    if (acks === null || acks.link !== link) return; // a late delivery from a dead channel: it will be redelivered
    const tag = message.fields.deliveryTag;
    acks.tracker.received(tag);
    if (this.options.injectBug === 'main') acks.tracker.received(tag); // fault injection: a tag out of sequence
    const { stats } = this.runtime;
    stats.add('received');

    const parsed = this.parseDelivery(message.content, message.properties);
    if (!parsed.ok) {
      recordDeadLetter(this.tracer, this.config.queue, parsed.reason, message.properties.headers?.traceparent);
      this.deadLetter(link, message, formatReason(parsed.reason, parsed.detail), parsed.reason);
      return;
    }
    const digest = markerDigest(parsed.message.id);
    const parts =
      this.markerScope === 'message'
        ? wholeMessagePart(parsed.message.changes, markerShardOf(digest, this.config.virtualShards), this.config.acceptTypes)
        : splitByShard(parsed.message.changes, this.config.virtualShards, this.config.acceptTypes);
    if (parts.size === 0) {
      stats.add('empty');
      this.finish(link, tag);
      return;
    }
    const delivery: Delivery = {
      tag,
      link,
      id: parsed.message.id,
      digest,
      redelivered: message.fields.redelivered,
      remaining: parts.size,
      parts: parts.size,
      markedParts: 0,
      waiters: [],
      receivedAt: performance.now(),
      publishedAt: timestampToMs(message.properties.timestamp),
      traceparent: message.properties.headers?.traceparent,
      message,
      refusal: null,
    };
    const first = this.messagesInProgress.get(delivery.id);
    if (first !== undefined) {
      // Invariant 4: the same id already has parts in flight. Counting this
      // copy now could race the first past the marker pre-check; instead it
      // waits and is settled as a duplicate when the first is done.
      first.waiters.push(delivery);
    } else {
      this.messagesInProgress.set(delivery.id, delivery);
      for (const [vshard, changes] of parts) this.runtime.lanes.add(vshard, { delivery, changes });
    }
    // Prefetch credit exhausted: nothing more arrives until something is
    // acked, so waiting out the batch timers would only add latency.
    // Counted as the broker counts: finished deliveries that wait for an
    // earlier one to finish still hold credit until the multiple-ack.
    if (acks.tracker.unacked >= this.config.prefetch) this.runtime.lanes.flushAll();
  }

  private deadLetter(link: ChannelLink, message: ConsumeMessage, reason: string, code: string): void {
    this.badLog.record(code, reason, message.properties.messageId);
    const { link: amqpLink, stats } = this.runtime;
    // Given up when the channel dies: the original is redelivered on the next one.
    const published = retryUntilDone(() => amqpLink.deadLetter(link, message, reason), {
      stopWhen: () => !link.alive,
      onAttemptFailed: ({ error, delayMs }) => this.log.warn({ err: describeError(error), delayMs }, 'dead-letter publish not confirmed; retrying'),
    });
    const pending = published.then((outcome) => {
      if (outcome === RETRY_STOPPED) return;
      stats.add('dead_lettered');
      this.finish(link, message.fields.deliveryTag);
    });
    this.pendingDeadLetters.add(pending);
    void pending.finally(() => this.pendingDeadLetters.delete(pending));
  }

  /** Runs one shard batch on its owner thread; retried until it completes. */
  private async runBatch(vshard: number, parts: PendingPart[]): Promise<void> {
    const { span, traceparent } = startBatchSpan(this.tracer, {
      vshard,
      queue: this.config.queue,
      mode: this.config.mode,
      parts: parts.length,
      traceparents: parts.map((part) => part.delivery.traceparent as string | undefined),
      distinctSkus: () => new Set(parts.flatMap((part) => part.changes.map(([sku]) => sku))).size,
    });
    // Made here, once, not in the thread: every rerun below (a dead thread, a
    // lost reply) carries the same id and finds the write receipt of an earlier
    // run, so the counts are never written twice (invariant 12).
    const batchId = randomUUID();
    const started = performance.now();
    const { pools, exposure, stats, telemetry } = this.runtime;
    const metrics = telemetry?.metrics;
    // A thread that died mid-batch is replaced by piscina. Re-running the
    // batch is safe: its receipt (same batch id) answers a count write that
    // already landed, so only the markers are occupied again. A `transient`
    // or `fatal` failure is retried, visibly; a `data` failure would fail the
    // same way forever, so it is isolated instead (batch-isolation.ts).
    const runRange = async (id: string, from: number, to: number): Promise<BatchResult> => {
      const task = encodeBatchTask(
        vshard,
        id,
        to - from,
        (i) => ({ id: parts[from + i]!.delivery.id, digest: parts[from + i]!.delivery.digest, changes: parts[from + i]!.changes }),
        traceparent,
        // Each part's share of its message, for the threads' window gauge.
        this.config.mode === 'two-step' ? Float64Array.from({ length: to - from }, (_, i) => 1 / parts[from + i]!.delivery.parts) : undefined,
      );
      const outcome = await retryUntilDone(() => pools.run(task), {
        // Stopping: the threads were terminated; the deliveries stay unacked and go back to the broker.
        stopWhen: () => pools.stopped,
        giveUp: (failureClass) => failureClass === 'data',
        onAttemptFailed: ({ error, attempt, delayMs, failureClass }) => {
          failBatchSpan(span, error);
          this.log.error(
            { vshard, batchId: id, attempt, delayMs, failureClass, err: describeError(error), trace_id: traceparent?.slice(3, 35) },
            'batch failed in its worker thread; retrying',
          );
        },
      });
      if (outcome === RETRY_STOPPED) throw new BatchAbandoned();
      return outcome;
    };
    let result: BatchResult;
    try {
      result = await runIsolating(vshard, parts.length, batchId, runRange, (error, id, from, to) => {
        failBatchSpan(span, error);
        this.log.error(
          { vshard, batchId: id, parts: to - from, failureClass: 'data', err: describeError(error), trace_id: traceparent?.slice(3, 35) },
          to - from === 1
            ? 'redis refused a part for its data: its message goes to the dead-letter queue (count-refused)'
            : 'batch refused for its data; isolating its parts',
        );
      });
    } catch (error) {
      exposure.batchReturned(vshard);
      if (!(error instanceof BatchAbandoned)) throw error;
      span.end();
      return;
    }
    exposure.batchReturned(vshard);
    endBatchSpan(span, result);
    metrics?.recordBatch(parts.length, performance.now() - started, result);
    stats.add('occupation_failures', result.occupationFailures);
    stats.add('write_retries', result.writeRetries);
    stats.add('count_errors', result.refusals.length);
    stats.add('claim_takeovers', result.claimTakeovers);
    exposure.batchDone(parts.filter((_, i) => result.marked[i] !== PART_HELD).map((part) => part.delivery));
    for (const refusal of result.refusals) {
      const delivery = parts[refusal.part]!.delivery;
      delivery.refusal ??= describeCountRefusal(vshard, refusal);
    }
    let held = 0;
    for (let i = 0; i < parts.length; i++) {
      const delivery = parts[i]!.delivery;
      if (result.marked[i] === PART_HELD) {
        // Another daemon is counting a copy of this message right now: run
        // this part again shortly; by then it is marked (a duplicate) or its
        // claim has run out (that daemon died: counted here).
        held++;
        this.runtime.lanes.hold(vshard, parts[i]!, CLAIM_RETRY_MS);
        this.heldByClaim(delivery);
        continue;
      }
      if (result.marked[i] === PART_DONE) delivery.markedParts++;
      if (--delivery.remaining === 0) this.settle(delivery);
    }
    if (held > 0) {
      stats.add('claim_holds', held);
      this.scheduleAcks();
    }
  }

  /**
   * A delivery waiting for another daemon's claim (up to the claim TTL, e.g.
   * after that daemon was killed) must not hold back the acks behind it: the
   * prefetch window would fill and this daemon count nothing meanwhile. Its
   * copies waiting on it wait as long.
   */
  private heldByClaim(delivery: Delivery): void {
    const acks = this.acks;
    if (acks === null) return;
    for (const { link, tag } of [delivery, ...delivery.waiters]) if (acks.link === link && link.alive) acks.tracker.heldByClaim(tag);
  }

  /** Every part of a delivery is written and marked: classify it and release its waiters. */
  private settle(delivery: Delivery): void {
    const { stats, exposure, telemetry } = this.runtime;
    const metrics = telemetry?.metrics;
    this.messagesInProgress.delete(delivery.id);
    const now = metrics ? performance.now() : 0;
    const wallNow = metrics ? Date.now() : 0;
    metrics?.recordAck(delivery.receivedAt, delivery.publishedAt, wallNow, now);
    if (delivery.refusal !== null) {
      // A part Redis refused counted nothing and has no marker; the others are
      // counted and marked. Dead-lettered, not acked: the replay (after the
      // key is repaired) counts the refused part once and skips the others by
      // their markers (within the marker TTL).
      recordDeadLetter(this.tracer, this.config.queue, COUNT_REFUSED, delivery.traceparent);
      this.deadLetter(delivery.link, delivery.message, `${COUNT_REFUSED}: ${delivery.refusal}`, COUNT_REFUSED);
    } else if (delivery.markedParts === delivery.parts) stats.add('duplicates');
    else if (delivery.markedParts === 0) {
      stats.add('counted');
      if (delivery.redelivered) stats.add('redelivered_unmarked');
    } else stats.add('partial_duplicates');
    if (delivery.refusal === null) this.finish(delivery.link, delivery.tag);
    for (const waiter of delivery.waiters) {
      metrics?.recordAck(waiter.receivedAt, waiter.publishedAt, wallNow, now);
      stats.add('duplicates');
      exposure.occupied(waiter.link, waiter.tag, 1);
      this.finish(waiter.link, waiter.tag);
    }
  }

  /** A bug (invariant 13): nothing is acked from now on, and main.ts's handler logs it and exits 70. */
  private bug(error: unknown, where: 'batch' | 'delivery'): void {
    this.halted = true;
    if (this.options.onBug === undefined) throw error;
    this.options.onBug(error, where);
  }

  private finish(link: ChannelLink, tag: number): void {
    const acks = this.acks;
    if (acks === null || acks.link !== link || !link.alive) return;
    acks.tracker.finish(tag);
    this.scheduleAcks();
  }

  /** Coalesce: every completion of this turn is covered by one multiple-ack. */
  private scheduleAcks(): void {
    if (this.ackScheduled) return;
    this.ackScheduled = true;
    setImmediate(() => {
      this.ackScheduled = false;
      this.sendAcks();
    });
  }

  /**
   * The normal path: one multiple-ack for the finished run at the head. Then,
   * when the head has been unfinished for TALLY_STALL_MS (or at once when it
   * waits for another daemon's claim), the finished deliveries behind it one
   * by one (ack-tracker.ts): they must not wait for it until consumer_timeout
   * closes the channel and they are counted again.
   */
  private sendAcks(): void {
    const acks = this.acks;
    if (acks === null || this.halted) return;
    const { link, exposure } = this.runtime;
    const upTo = acks.tracker.takeAckable();
    if (upTo !== null) {
      link.ack(acks.link, upTo);
      exposure.acked(upTo);
    }
    const single = acks.tracker.takeStalledAcks(this.config.stallMs);
    for (const tag of single) {
      link.ack(acks.link, tag, false);
      exposure.ackedOne(tag);
    }
    this.noteStall(acks.tracker, single.length);
  }

  /** One log line when a stall begins (and each time it acks around it, at debug), one when it ends. */
  private noteStall(tracker: AckTracker, singleAcks: number): void {
    const ageMs = tracker.oldestUnackedAgeMs();
    const stalled = ageMs !== null && ageMs >= this.config.stallMs && tracker.inProgress > 0;
    if (stalled && this.stalledSince === null) {
      this.stalledSince = Date.now();
      this.log.warn(
        { oldestUnackedS: Math.round(ageMs) / 1000, stallMs: this.config.stallMs, singleAcks, inProgress: tracker.inProgress },
        'stalled: the oldest unacked delivery has not finished; acking the finished ones behind it one by one',
      );
    } else if (stalled && singleAcks > 0) this.log.debug({ singleAcks }, 'acked finished deliveries behind the stalled one');
    else if (!stalled && this.stalledSince !== null) {
      this.log.info({ stalledMs: Date.now() - this.stalledSince }, 'stall over: the oldest unacked delivery finished');
      this.stalledSince = null;
    }
  }

  /** Nothing waits in a lane, no batch runs, no dead letter is unconfirmed, no delivery is unsettled. */
  private drained(runtime: Runtime): boolean {
    const load = runtime.lanes.load;
    return load.pendingParts === 0 && load.busyLanes === 0 && this.pendingDeadLetters.size === 0 && this.messagesInProgress.size === 0;
  }

  /**
   * Resolves once drained(), waiting on the lanes' and the dead letters' own
   * promises. Deliveries that arrived before the cancel took effect add new
   * parts meanwhile, hence the loop; it ends early if nothing left could
   * finish what is still unsettled (its deliveries go back to the broker).
   */
  private async whenDrained(runtime: Runtime): Promise<void> {
    while (!this.drained(runtime)) {
      const load = runtime.lanes.load;
      if (load.pendingParts === 0 && load.busyLanes === 0 && this.pendingDeadLetters.size === 0) return;
      await Promise.all([runtime.lanes.whenIdle(), ...this.pendingDeadLetters]);
    }
  }

  /** Waits for whenDrained(), at most `graceMs`; true when drained. */
  private async drainWithin(runtime: Runtime, graceMs: number): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, graceMs);
    });
    try {
      await Promise.race([this.whenDrained(runtime), graceOver]);
    } finally {
      clearTimeout(timer);
    }
    return this.drained(runtime);
  }

  /**
   * Stops consuming, finishes and acks what is in flight, then closes. Safe
   * to call twice: the second call returns the first one's promise.
   */
  stop(graceMs = this.config.shutdownGraceMs): Promise<void> {
    this.stopping ??= this.stopOnce(graceMs);
    return this.stopping;
  }

  /**
   * The shutdown as an ordered list of steps, each guarded on its own: a
   * step that fails is logged by name and the next one still runs, so
   * connections are closed whatever happened before.
   */
  private async stopOnce(graceMs: number): Promise<void> {
    const { log } = this;
    this.state = 'stopping';
    if (this.stallTimer) clearInterval(this.stallTimer);
    log.info({ graceMs }, 'stopping: no new deliveries, finishing what is in flight');
    const graceEndsAt = performance.now() + graceMs;
    const runtime = this.built;
    if (runtime !== null) {
      const { link, lanes, stats, exposure, pools, heartbeat, redis, health, telemetry } = runtime;
      const progress = (step: string | null) => {
        this.stopStep = step;
      };
      // Within the grace period: stop the flow, finish and ack what can be.
      await runSteps(
        [
          { name: 'stop consuming', run: () => link.stopConsuming(Math.min(STEP_TIMEOUT_MS, graceMs)) },
          {
            name: 'finishing in-flight deliveries',
            run: async () => {
              lanes.flushAll();
              if (!(await this.drainWithin(runtime, Math.max(0, graceEndsAt - performance.now())))) {
                log.warn(
                  { messagesInProgress: this.messagesInProgress.size, ...lanes.load },
                  'grace period over; unfinished deliveries stay unacked and will be redelivered',
                );
              }
            },
          },
          { name: 'final ack', run: () => this.sendAcks() },
          { name: 'closing the shard lanes', run: () => lanes.close() },
        ],
        log,
        progress,
      );
      // After it: every step that waits on a server is bounded, in total by CLOSE_BUDGET_MS.
      // The threads stop first: a batch still writing after the channel closed
      // (and the broker handed its deliveries to another daemon) could count
      // them a second time; a terminated thread writes nothing more.
      const closeBy = Math.max(performance.now(), graceEndsAt) + CLOSE_BUDGET_MS;
      await runSteps(
        [
          { name: 'flushing worker spans', timeoutMs: 500, run: () => pools.flushTelemetry() },
          {
            name: 'stopping worker threads',
            timeoutMs: STEP_TIMEOUT_MS,
            run: async () => {
              await pools.destroy();
              log.info('worker threads stopped');
            },
          },
          {
            name: 'final stats flush',
            timeoutMs: STEP_TIMEOUT_MS,
            run: () => {
              exposure.stop();
              stats.stop();
              return stats.flush();
            },
          },
          { name: 'closing amqp', timeoutMs: STEP_TIMEOUT_MS + 100, run: () => link.close(STEP_TIMEOUT_MS) },
          { name: 'stopping the heartbeat', timeoutMs: 500, run: () => heartbeat.stop() },
          closeRedisStep(redis),
          { name: 'closing the health channel', run: () => health.close() },
          ...(telemetry === null ? [] : [{ name: 'closing the metrics endpoint', timeoutMs: 500, run: () => closeTelemetry(telemetry) }]),
        ],
        log,
        progress,
        closeBy,
      );
    }
    this.state = 'stopped';
    log.info({ counters: runtime?.stats.sinceStart }, 'stopped');
  }
}

/** Message-scoped markers on a Redis Cluster: a message's counts span hash slots, so no script can write them with its one marker. */
function messageScopeOnCluster(prefix: string): MarkerFormatRefusedError {
  return new MarkerFormatRefusedError(
    `TALLY_MARKER_SCOPE=message needs a standalone Redis, and this one is a cluster (prefix "${prefix}"): a message's counts span hash slots, ` +
      `so they cannot be written with its one marker. Use TALLY_MARKER_SCOPE=part (the default) with a new TALLY_PREFIX on a cluster.`,
  );
}

/** The x-tally-reason detail of a refused part: the Redis error, then where it happened. */
function describeCountRefusal(vshard: number, refusal: CountRefusal): string {
  const where = refusal.key === '' ? `shard ${vshard}` : `sku ${JSON.stringify(refusal.sku)}, key ${refusal.key}, delta ${refusal.delta}`;
  return `${refusal.error} (${where})`;
}

/** The threads were stopped while a batch was being retried: it is given up, its deliveries stay unacked. */
class BatchAbandoned extends Error {
  constructor() {
    super('batch abandoned: the worker threads stopped');
    this.name = 'BatchAbandoned';
  }
}

async function closeTelemetry(telemetry: Telemetry): Promise<void> {
  await telemetry.endpoints.close();
  await telemetry.meterProvider.shutdown();
}
