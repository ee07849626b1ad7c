/**
 * The daemon's lifecycle and the path of one delivery:
 *
 *   delivery -> parse -> (bad: dead-letter, ack) -> split by virtual shard
 *            -> hold if the same id is in flight -> shard lanes -> worker thread
 *            -> every part reported done -> ack (contiguous multiple-ack)
 */
import { metrics, trace, type Tracer } from '@opentelemetry/api';
import type { MeterProvider } from '@opentelemetry/sdk-metrics';
import type { ConsumeMessage } from 'amqplib';
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import {
  PART_DONE,
  PART_HELD,
  describeError,
  encodeBatchTask,
  formatReason,
  isTallyError,
  parseMessage,
  redactUrl,
  retryUntilDone,
  RETRY_STOPPED,
  splitByShard,
  type TallyConfig,
} from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import { AckTracker } from './ack-tracker.js';
import { AmqpLink, type AmqpBrokerState } from './amqp-link.js';
import type { ChannelLink, Delivery } from './delivery.js';
import { ensureLayout } from './layout-guard.js';
import { probeRedis, type RedisProbeReport } from './redis-probe.js';
import { Heartbeat, HEARTBEAT_TTL_BEATS, newDaemonId } from './heartbeat.js';
import type { Logger } from './logger.js';
import { ShardLanes, type PendingPart } from './shard-lanes.js';
import { StatsRecorder } from './stats-recorder.js';
import { WorkerPools } from './worker-pools.js';
import { BadMessageLog } from './bad-message-log.js';
import { ExposureMeter } from './exposure-meter.js';
import { endBatchSpan, failBatchSpan, recordDeadLetter, startBatchSpan } from './telemetry/batch-span.js';
import { HttpEndpoints } from './telemetry/http-endpoints.js';
import { registerSafetyGauges } from './telemetry/safety-gauges.js';
import { DaemonMetrics, timestampToMs } from './telemetry/metrics.js';
import { createMetricsExport } from './telemetry/metrics-export.js';

/** How long a part held by another daemon's claim waits before it is tried again. */
const CLAIM_RETRY_MS = 200;

export type DaemonState = 'created' | 'starting' | 'running' | 'stopping' | 'stopped';

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
  readonly redis: Redis;
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

/** One step of a shutdown: run in order, each on its own, a failure logged by name and the next one run anyway. */
interface ShutdownStep {
  readonly name: string;
  run(): unknown;
}

async function runSteps(steps: readonly ShutdownStep[], log: Logger): Promise<void> {
  for (const step of steps) {
    try {
      await step.run();
    } catch (error) {
      log.warn({ step: step.name, err: describeError(error) }, `${step.name} failed`);
    }
  }
}

async function closeRedis(redis: Redis): Promise<void> {
  try {
    await redis.quit();
  } catch {
    redis.disconnect();
  }
}

export class Daemon {
  private state: DaemonState = 'created';
  /** Null until start() has built it; never partly built. */
  private built: Runtime | null = null;
  private readonly badLog: BadMessageLog;
  /** Ack bookkeeping of the live channel; replaced on every reconnect. */
  private acks: { link: ChannelLink; tracker: AckTracker } | null = null;
  private ackScheduled = false;
  /** Message ids with parts in flight: a second delivery of one waits for the first. */
  private readonly inFlight = new Map<string, Delivery>();
  /** Dead-letter publishes not yet confirmed (or given up with their channel). */
  private readonly pendingDeadLetters = new Set<Promise<void>>();
  private stopping: Promise<void> | null = null;
  private readonly tracer: Tracer = trace.getTracer('tally.coordinator');
  private readonly parseOptions: { readonly maxBytes: number };
  /** This daemon's id in its heartbeat key and mode lease. */
  readonly daemonId = newDaemonId();
  /** Names this daemon's two-step claims (new at every start: a restarted daemon waits out its predecessor's claims like anyone's). */
  private readonly claimToken = randomBytes(8).toString('hex');

  constructor(
    private readonly config: TallyConfig,
    private readonly log: Logger,
  ) {
    this.badLog = new BadMessageLog(log);
    this.parseOptions = Object.freeze({ maxBytes: config.maxMessageBytes });
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
    inFlight: number;
    redis: RedisProbeReport | null;
    amqp: AmqpBrokerState | null;
  } {
    return {
      state: this.state,
      consuming: this.built?.link.consuming ?? false,
      redisReady: this.built?.redis.status === 'ready',
      inFlight: this.inFlight.size,
      redis: this.built?.redisProbe ?? null,
      amqp: this.built?.link.brokerState ?? null,
    };
  }

  /** Ready: running, connected to both servers, consuming. What /readyz answers. */
  get ready(): boolean {
    const status = this.status;
    return status.state === 'running' && status.consuming && status.redisReady;
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
        batchWaitMs: config.batchWaitMs,
        markerTtlS: config.markerTtlS,
        acceptTypes: config.acceptTypes ? [...config.acceptTypes] : 'all',
      },
      'starting',
    );
    this.built = await this.openRuntime();
    await this.built.link.start();
    this.state = 'running';
    void this.built.heartbeat.beatOnce(); // show "consuming" now, not at the next interval
  }

  private heartbeatSnapshot(): { consuming: boolean; oldestUnackedS: number | null; inFlight: number } {
    const tracker = this.acks?.tracker;
    const ageMs = tracker?.oldestUnackedAgeMs() ?? null;
    return { consuming: this.built?.link.consuming ?? false, oldestUnackedS: ageMs === null ? null : ageMs / 1000, inFlight: tracker?.unacked ?? 0 };
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
    const redis = createRedisClient(config.redisUrl, 'tally-coordinator');
    redis.on('error', () => {});
    redis.on('ready', () => log.info({ redis: redactUrl(config.redisUrl) }, 'redis ready'));
    redis.on('end', () => log.warn('redis connection ended'));
    const opened: ShutdownStep[] = [{ name: 'closing redis', run: () => closeRedis(redis) }];
    try {
      const lease = { holder: this.daemonId, ttlMs: HEARTBEAT_TTL_BEATS * config.heartbeatMs };
      const layout = await this.untilRedis('layout check', () => ensureLayout(redis, config, lease));
      log.info({ virtualShards: layout.virtualShards, created: layout.created, daemonId: this.daemonId, markers: layout.markers }, 'shard layout verified');
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

      const stats = new StatsRecorder(redis, config.prefix, log);
      stats.start();
      const exposure = new ExposureMeter(stats, () => (this.acks?.tracker.unacked ?? 0) * 2 >= config.prefetch, config.mode === 'two-step');
      exposure.start();
      opened.unshift({
        name: 'final stats flush',
        run: () => {
          exposure.stop();
          stats.stop();
          return stats.flush();
        },
      });
      const telemetry = await this.startMetrics(stats, redis, redisProbe);
      if (telemetry !== null) opened.unshift({ name: 'closing the metrics endpoint', run: () => closeTelemetry(telemetry) });

      const pools = new WorkerPools(
        {
          redisUrl: config.redisUrl,
          prefix: config.prefix,
          mode: config.mode,
          markerTtlS: config.markerTtlS,
          countTtlS: config.countTtlS,
          logLevel: config.logLevel,
          markerBucketS: layout.markers.bucketS,
          markerSubBuckets: layout.markers.subBuckets,
          claimToken: this.claimToken,
          claimTtlMs: config.markerClaimTtlS * 1000,
        },
        config.workers,
        config.virtualShards,
      );
      const lanes = new ShardLanes(config, (vshard, parts) => this.runBatch(vshard, parts));
      const link = new AmqpLink(
        {
          url: config.amqpUrl,
          queue: config.queue,
          deadLetterQueue: config.deadLetterQueue,
          prefetch: config.prefetch,
          queueType: config.queueType,
          deliveryLimit: config.deliveryLimit,
        },
        log,
        {
          onDelivery: (link, message) => this.onDelivery(link, message),
          onLinkUp: (link) => {
            this.acks = { link, tracker: new AckTracker() };
            exposure.channelChanged(link);
          },
          onLinkDown: (link, reason) => {
            if (this.acks?.link === link) this.acks = null;
            log.warn({ reason, generation: link.generation }, 'deliveries of the lost channel are left to redelivery');
          },
        },
      );
      return { redisProbe, redis, heartbeat, stats, exposure, telemetry, pools, lanes, link };
    } catch (error) {
      await runSteps(opened, log);
      throw error;
    }
  }

  /** Metrics and the HTTP endpoint, when TALLY_METRICS_PORT is set. */
  private async startMetrics(stats: StatsRecorder, redis: Redis, redisProbe: RedisProbeReport): Promise<Telemetry | null> {
    const { config } = this;
    if (config.metricsPort === null) return null;
    const { exporter, provider: meterProvider } = await createMetricsExport();
    metrics.setGlobalMeterProvider(meterProvider);
    const daemonMetrics = new DaemonMetrics(
      meterProvider.getMeter('tally'),
      { queue: config.queue, mode: config.mode, virtualShards: config.virtualShards },
      {
        counters: () => stats.sinceStart,
        inFlight: () => this.acks?.tracker.unacked ?? 0,
        // Lanes and link exist once start() has built the runtime; a scrape before that sees none.
        shardDepths: () => this.built?.lanes.depths() ?? [],
        connections: () => ({ amqp: (this.built?.link.current ?? null) !== null, redis: redis.status === 'ready' }),
        // Map order is arrival order: the first delivery with parts in flight is the oldest one holding the acks back.
        oldestUnackedAgeSeconds: () => {
          const oldest = this.inFlight.values().next().value;
          return oldest === undefined ? 0 : (performance.now() - oldest.receivedAt) / 1000;
        },
      },
    );
    registerSafetyGauges(
      meterProvider.getMeter('tally'),
      { 'messaging.system': 'rabbitmq', 'messaging.destination.name': config.queue },
      {
        redisProbe: () => redisProbe,
        amqpBlocked: () => this.built?.link.brokerState.blocked ?? false,
        unroutableDeadLetters: () => this.built?.link.brokerState.unroutableDeadLetters ?? 0,
      },
    );
    const endpoints = new HttpEndpoints(exporter, () => ({ ready: this.ready, detail: this.status }));
    const port = await endpoints.listen(config.metricsPort, config.metricsHost);
    this.log.info({ host: config.metricsHost, port, paths: ['/metrics', '/healthz', '/readyz'] }, 'http endpoint listening');
    return { metrics: daemonMetrics, meterProvider, endpoints, port };
  }

  /** Startup steps wait for Redis like everything else (invariant 8), but fatal errors still stop the start. */
  private untilRedis<T>(what: string, step: () => Promise<T>): Promise<T> {
    return retryUntilDone(step, {
      // Only Tally's own refusals (layout, mode) stop the start today; a
      // `fatal` server refusal (failureClass) is where "Never silently wrong"
      // stops it too.
      giveUp: (_failureClass, error) => isTallyError(error),
      onAttemptFailed: ({ error, attempt, delayMs, failureClass }) =>
        this.log.warn({ what, attempt, delayMs, failureClass, err: describeError(error) }, 'redis unavailable; retrying'),
    });
  }

  private onDelivery(link: ChannelLink, message: ConsumeMessage): void {
    const acks = this.acks;
    if (acks === null || acks.link !== link) return; // a late delivery from a dead channel: it will be redelivered
    const tag = message.fields.deliveryTag;
    acks.tracker.received(tag);
    const { stats } = this.runtime;
    stats.add('received');

    const parsed = parseMessage(message.content, message.properties.messageId, this.parseOptions);
    if (!parsed.ok) {
      recordDeadLetter(this.tracer, this.config.queue, parsed.reason, message.properties.headers?.traceparent);
      this.deadLetter(link, message, formatReason(parsed.reason, parsed.detail), parsed.reason);
      return;
    }
    const parts = splitByShard(parsed.message.changes, this.config.virtualShards, this.config.acceptTypes);
    if (parts.size === 0) {
      stats.add('empty');
      this.finish(link, tag);
      return;
    }
    const delivery: Delivery = {
      tag,
      link,
      id: parsed.message.id,
      redelivered: message.fields.redelivered,
      remaining: parts.size,
      parts: parts.size,
      markedParts: 0,
      waiters: [],
      receivedAt: performance.now(),
      publishedAt: timestampToMs(message.properties.timestamp),
      traceparent: message.properties.headers?.traceparent,
    };
    const first = this.inFlight.get(delivery.id);
    if (first !== undefined) {
      // Invariant 4: the same id already has parts in flight. Counting this
      // copy now could race the first past the marker pre-check; instead it
      // waits and is settled as a duplicate when the first is done.
      first.waiters.push(delivery);
    } else {
      this.inFlight.set(delivery.id, delivery);
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
    const task = encodeBatchTask(vshard, parts.length, (i) => ({ id: parts[i]!.delivery.id, changes: parts[i]!.changes }), traceparent);
    const started = performance.now();
    const { pools, exposure, stats, telemetry } = this.runtime;
    const metrics = telemetry?.metrics;
    // A thread that died mid-batch is replaced by piscina. Re-running the
    // batch is safe: at worst it repeats a count write whose markers were
    // never occupied, exactly the crash window the counters report. A `data`
    // failure is retried too for now: "Never silently wrong" isolates and
    // dead-letters it here (giveUp on 'data', then split the batch).
    const result = await retryUntilDone(() => pools.run(task), {
      onAttemptFailed: ({ error, attempt, delayMs, failureClass }) => {
        failBatchSpan(span, error);
        this.log.error(
          { vshard, attempt, delayMs, failureClass, err: describeError(error), trace_id: traceparent?.slice(3, 35) },
          'batch failed in its worker thread; retrying',
        );
      },
    });
    endBatchSpan(span, result);
    metrics?.recordBatch(parts.length, performance.now() - started, result);
    stats.add('occupation_failures', result.occupationFailures);
    stats.add('write_retries', result.writeRetries);
    stats.add('count_errors', result.countErrors);
    stats.add('claim_takeovers', result.claimTakeovers);
    exposure.batchDone(
      parts.filter((_, i) => result.marked[i] !== PART_HELD).map((part) => part.delivery),
      result.timings,
    );
    let held = 0;
    for (let i = 0; i < parts.length; i++) {
      const delivery = parts[i]!.delivery;
      if (result.marked[i] === PART_HELD) {
        // Another daemon is counting a copy of this message right now: run
        // this part again shortly; by then it is marked (a duplicate) or its
        // claim has run out (that daemon died: counted here).
        held++;
        this.runtime.lanes.hold(vshard, parts[i]!, CLAIM_RETRY_MS);
        continue;
      }
      if (result.marked[i] === PART_DONE) delivery.markedParts++;
      if (--delivery.remaining === 0) this.settle(delivery);
    }
    if (held > 0) stats.add('claim_holds', held);
  }

  /** Every part of a delivery is written and marked: classify it and release its waiters. */
  private settle(delivery: Delivery): void {
    const { stats, exposure, telemetry } = this.runtime;
    const metrics = telemetry?.metrics;
    this.inFlight.delete(delivery.id);
    const now = metrics ? performance.now() : 0;
    const wallNow = metrics ? Date.now() : 0;
    metrics?.recordAck(delivery.receivedAt, delivery.publishedAt, wallNow, now);
    if (delivery.markedParts === delivery.parts) stats.add('duplicates');
    else if (delivery.markedParts === 0) {
      stats.add('counted');
      if (delivery.redelivered) stats.add('redelivered_unmarked');
    } else stats.add('partial_duplicates');
    this.finish(delivery.link, delivery.tag);
    for (const waiter of delivery.waiters) {
      metrics?.recordAck(waiter.receivedAt, waiter.publishedAt, wallNow, now);
      stats.add('duplicates');
      exposure.occupied(waiter.link, waiter.tag, 1);
      this.finish(waiter.link, waiter.tag);
    }
  }

  private finish(link: ChannelLink, tag: number): void {
    const acks = this.acks;
    if (acks === null || acks.link !== link || !link.alive) return;
    acks.tracker.finish(tag);
    if (this.ackScheduled) return;
    // Coalesce: every completion of this turn is covered by one multiple-ack.
    this.ackScheduled = true;
    setImmediate(() => {
      this.ackScheduled = false;
      this.sendAcks();
    });
  }

  private sendAcks(): void {
    const acks = this.acks;
    if (acks === null) return;
    const upTo = acks.tracker.takeAckable();
    if (upTo === null) return;
    this.runtime.link.ack(acks.link, upTo);
    this.runtime.exposure.acked(upTo);
  }

  /** Nothing waits in a lane, no batch runs, no dead letter is unconfirmed, no delivery is unsettled. */
  private drained(runtime: Runtime): boolean {
    const load = runtime.lanes.load;
    return load.pendingParts === 0 && load.busyLanes === 0 && this.pendingDeadLetters.size === 0 && this.inFlight.size === 0;
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
    log.info({ graceMs }, 'stopping: no new deliveries, finishing what is in flight');
    const runtime = this.built;
    if (runtime !== null) {
      const { link, lanes, stats, exposure, pools, heartbeat, redis, telemetry } = runtime;
      await runSteps(
        [
          { name: 'stop consuming', run: () => link.stopConsuming() },
          {
            name: 'finishing in-flight deliveries',
            run: async () => {
              lanes.flushAll();
              if (!(await this.drainWithin(runtime, graceMs))) {
                log.warn({ inFlight: this.inFlight.size, ...lanes.load }, 'grace period over; unfinished deliveries stay unacked and will be redelivered');
              }
            },
          },
          { name: 'final ack', run: () => this.sendAcks() },
          { name: 'closing the shard lanes', run: () => lanes.close() },
          {
            name: 'final stats flush',
            run: () => {
              exposure.stop();
              stats.stop();
              return stats.flush();
            },
          },
          { name: 'closing amqp', run: () => link.close() },
          {
            name: 'stopping worker threads',
            run: async () => {
              await pools.flushTelemetry();
              await pools.destroy();
            },
          },
          { name: 'stopping the heartbeat', run: () => heartbeat.stop() },
          { name: 'closing redis', run: () => closeRedis(redis) },
          ...(telemetry === null ? [] : [{ name: 'closing the metrics endpoint', run: () => closeTelemetry(telemetry) }]),
        ],
        log,
      );
    }
    this.state = 'stopped';
    log.info({ counters: runtime?.stats.sinceStart }, 'stopped');
  }
}

async function closeTelemetry(telemetry: Telemetry): Promise<void> {
  await telemetry.endpoints.close();
  await telemetry.meterProvider.shutdown();
}
