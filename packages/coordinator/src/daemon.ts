/**
 * The daemon's lifecycle and the path of one delivery:
 *
 *   delivery -> parse -> (bad: dead-letter, ack) -> split by virtual shard
 *            -> hold if the same id is in flight -> shard lanes -> worker thread
 *            -> every part reported done -> ack (contiguous multiple-ack)
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { metrics, trace, type Tracer } from '@opentelemetry/api';
import type { MeterProvider } from '@opentelemetry/sdk-metrics';
import type { ConsumeMessage } from 'amqplib';
import type { Redis } from 'ioredis';
import {
  backoffDelay,
  encodeBatchTask,
  formatReason,
  parseMessage,
  redactUrl,
  splitByShard,
  type TallyConfig,
} from '@tally/shared';
import { createRedisClient } from '@tally/worker';
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

export type DaemonState = 'created' | 'starting' | 'running' | 'stopping' | 'stopped';

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

export class Daemon {
  private state: DaemonState = 'created';
  private redis: Redis | null = null;
  private pools: WorkerPools | null = null;
  private lanes: ShardLanes | null = null;
  private link: AmqpLink | null = null;
  private stats: StatsRecorder | null = null;
  /** What a crash would cost right now, integrated for `tally deviation`. */
  private exposure: ExposureMeter | null = null;
  private readonly badLog: BadMessageLog;
  /** Ack bookkeeping of the live channel; replaced on every reconnect. */
  private acks: { link: ChannelLink; tracker: AckTracker } | null = null;
  private ackScheduled = false;
  /** Message ids with parts in flight: a second delivery of one waits for the first. */
  private readonly inFlight = new Map<string, Delivery>();
  private pendingDeadLetters = 0;
  private stopping: Promise<void> | null = null;
  private readonly tracer: Tracer = trace.getTracer('tally.coordinator');
  private readonly parseOptions: { readonly maxBytes: number };
  private metrics: DaemonMetrics | null = null;
  private meterProvider: MeterProvider | null = null;
  private endpoints: HttpEndpoints | null = null;
  /** This daemon's id in its heartbeat key and mode lease. */
  readonly daemonId = newDaemonId();
  private heartbeat: Heartbeat | null = null;
  /** The port the HTTP endpoint listens on, once started (TALLY_METRICS_PORT=0 picks one). */
  metricsPort: number | null = null;
  /** What the start-up probe found (docs/redis-requirements.md). */
  private redisProbe: RedisProbeReport | null = null;

  constructor(
    private readonly config: TallyConfig,
    private readonly log: Logger,
  ) {
    this.badLog = new BadMessageLog(log);
    this.parseOptions = Object.freeze({ maxBytes: config.maxMessageBytes });
  }

  get status(): { state: DaemonState; consuming: boolean; redisReady: boolean; inFlight: number; redis: RedisProbeReport | null; amqp: AmqpBrokerState | null } {
    return {
      state: this.state,
      consuming: this.link?.consuming ?? false,
      redisReady: this.redis?.status === 'ready',
      inFlight: this.inFlight.size,
      redis: this.redisProbe,
      amqp: this.link?.brokerState ?? null,
    };
  }

  /** Ready: running, connected to both servers, consuming. What /readyz answers. */
  get ready(): boolean {
    const status = this.status;
    return status.state === 'running' && status.consuming && status.redisReady;
  }

  /** Metrics and the HTTP endpoint, when TALLY_METRICS_PORT is set. */
  private async startMetrics(): Promise<void> {
    const { config } = this;
    if (config.metricsPort === null) return;
    const { exporter, provider } = await createMetricsExport();
    this.meterProvider = provider;
    metrics.setGlobalMeterProvider(this.meterProvider);
    this.metrics = new DaemonMetrics(
      this.meterProvider.getMeter('tally'),
      { queue: config.queue, mode: config.mode, virtualShards: config.virtualShards },
      {
        counters: () => this.stats!.sinceStart,
        inFlight: () => this.acks?.tracker.unacked ?? 0,
        shardDepths: () => this.lanes?.depths() ?? [],
        connections: () => ({ amqp: this.link?.current !== null && this.link !== null, redis: this.redis?.status === 'ready' }),
        // Map order is arrival order: the first delivery with parts in flight is the oldest one holding the acks back.
        oldestUnackedAgeSeconds: () => {
          const oldest = this.inFlight.values().next().value;
          return oldest === undefined ? 0 : (performance.now() - oldest.receivedAt) / 1000;
        },
      },
    );
    registerSafetyGauges(this.meterProvider.getMeter('tally'), { 'messaging.system': 'rabbitmq', 'messaging.destination.name': config.queue }, {
      redisProbe: () => this.redisProbe,
      amqpBlocked: () => this.link?.brokerState.blocked ?? false,
      unroutableDeadLetters: () => this.link?.brokerState.unroutableDeadLetters ?? 0,
    });
    this.endpoints = new HttpEndpoints(exporter, () => ({ ready: this.ready, detail: this.status }));
    this.metricsPort = await this.endpoints.listen(config.metricsPort, config.metricsHost);
    this.log.info({ host: config.metricsHost, port: this.metricsPort, paths: ['/metrics', '/healthz', '/readyz'] }, 'http endpoint listening');
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

    // Before anything is written: a Redis that cannot keep Tally's promise stops the start here.
    this.redisProbe = await this.untilRedis('redis probe', () => probeRedis(config, log));
    this.redis = createRedisClient(config.redisUrl, 'tally-coordinator');
    this.redis.on('error', () => {});
    this.redis.on('ready', () => log.info({ redis: redactUrl(config.redisUrl) }, 'redis ready'));
    this.redis.on('end', () => log.warn('redis connection ended'));
    const lease = { holder: this.daemonId, ttlMs: HEARTBEAT_TTL_BEATS * config.heartbeatMs };
    const layout = await this.untilRedis('layout check', () => ensureLayout(this.redis!, config, lease));
    log.info({ virtualShards: layout.virtualShards, created: layout.created, daemonId: this.daemonId }, 'shard layout verified');
    // From the layout check on, not from the link: the beat renews the mode lease the check took (layout-guard.ts).
    this.heartbeat = new Heartbeat(
      this.redis,
      this.daemonId,
      { prefix: config.prefix, mode: config.mode, queue: config.queue, intervalMs: config.heartbeatMs, ttlMs: lease.ttlMs },
      () => this.heartbeatSnapshot(),
      log,
    );
    this.heartbeat.start();

    this.stats = new StatsRecorder(this.redis, config.prefix, log);
    this.stats.start();
    this.exposure = new ExposureMeter(this.stats, () => (this.acks?.tracker.unacked ?? 0) * 2 >= config.prefetch, config.mode === 'two-step');
    this.exposure.start();
    await this.startMetrics();
    this.pools = new WorkerPools(
      {
        redisUrl: config.redisUrl,
        prefix: config.prefix,
        mode: config.mode,
        markerTtlS: config.markerTtlS,
        countTtlS: config.countTtlS,
        logLevel: config.logLevel,
      },
      config.workers,
      config.virtualShards,
    );
    this.lanes = new ShardLanes(config, (vshard, parts) => this.runBatch(vshard, parts));
    this.link = new AmqpLink(
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
          this.exposure?.channelChanged(link);
        },
        onLinkDown: (link, reason) => {
          if (this.acks?.link === link) this.acks = null;
          log.warn({ reason, generation: link.generation }, 'deliveries of the lost channel are left to redelivery');
        },
      },
    );
    await this.link.start();
    this.state = 'running';
    void this.heartbeat.beatOnce(); // show "consuming" now, not at the next interval
  }

  private heartbeatSnapshot(): { consuming: boolean; oldestUnackedS: number | null; inFlight: number } {
    const tracker = this.acks?.tracker;
    const ageMs = tracker?.oldestUnackedAgeMs() ?? null;
    return { consuming: this.link?.consuming ?? false, oldestUnackedS: ageMs === null ? null : ageMs / 1000, inFlight: tracker?.unacked ?? 0 };
  }

  /** Startup steps wait for Redis like everything else (invariant 8), but fatal errors still stop the start. */
  private async untilRedis<T>(what: string, step: () => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await step();
      } catch (error) {
        if (error instanceof Error && 'code' in error && String((error as { code: unknown }).code).startsWith('TALLY_')) throw error;
        const delayMs = backoffDelay(attempt);
        this.log.warn({ what, attempt, delayMs, err: describe(error) }, 'redis unavailable; retrying');
        await sleep(delayMs);
      }
    }
  }

  private onDelivery(link: ChannelLink, message: ConsumeMessage): void {
    const acks = this.acks;
    if (acks === null || acks.link !== link) return; // a late delivery from a dead channel: it will be redelivered
    const tag = message.fields.deliveryTag;
    acks.tracker.received(tag);
    const stats = this.stats!;
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
      for (const [vshard, changes] of parts) this.lanes!.add(vshard, { delivery, changes });
    }
    // Prefetch credit exhausted: nothing more arrives until something is
    // acked, so waiting out the batch timers would only add latency.
    // Counted as the broker counts: finished deliveries that wait for an
    // earlier one to finish still hold credit until the multiple-ack.
    if (acks.tracker.unacked >= this.config.prefetch) this.lanes!.flushAll();
  }

  private deadLetter(link: ChannelLink, message: ConsumeMessage, reason: string, code: string): void {
    this.badLog.record(code, reason, message.properties.messageId);
    this.pendingDeadLetters++;
    const attempt = async (): Promise<void> => {
      for (let tries = 0; link.alive; tries++) {
        try {
          await this.link!.deadLetter(link, message, reason);
          this.stats!.add('dead_lettered');
          this.finish(link, message.fields.deliveryTag);
          return;
        } catch (error) {
          if (!link.alive) return;
          const delayMs = backoffDelay(tries);
          this.log.warn({ err: describe(error), delayMs }, 'dead-letter publish not confirmed; retrying');
          await sleep(delayMs);
        }
      }
    };
    void attempt().finally(() => {
      this.pendingDeadLetters--;
    });
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
    for (let attempt = 0; ; attempt++) {
      try {
        const result = await this.pools!.run(task);
        endBatchSpan(span, result);
        this.metrics?.recordBatch(parts.length, performance.now() - started, result);
        const stats = this.stats!;
        stats.add('occupation_failures', result.occupationFailures);
        stats.add('write_retries', result.writeRetries);
        stats.add('count_errors', result.countErrors);
        this.exposure?.batchDone(parts.map((part) => part.delivery), result.timings);
        for (let i = 0; i < parts.length; i++) {
          const delivery = parts[i]!.delivery;
          if (result.marked[i] === 1) delivery.markedParts++;
          if (--delivery.remaining === 0) this.settle(delivery);
        }
        return;
      } catch (error) {
        // A thread that died mid-batch is replaced by piscina. Re-running the
        // batch is safe: at worst it repeats a count write whose markers were
        // never occupied, exactly the crash window the counters report.
        const delayMs = backoffDelay(attempt);
        failBatchSpan(span, error);
        this.log.error(
          { vshard, attempt, delayMs, err: describe(error), trace_id: traceparent?.slice(3, 35) },
          'batch failed in its worker thread; retrying',
        );
        await sleep(delayMs);
      }
    }
  }

  /** Every part of a delivery is written and marked: classify it and release its waiters. */
  private settle(delivery: Delivery): void {
    const stats = this.stats!;
    this.inFlight.delete(delivery.id);
    const now = this.metrics ? performance.now() : 0;
    const wallNow = this.metrics ? Date.now() : 0;
    this.metrics?.recordAck(delivery.receivedAt, delivery.publishedAt, wallNow, now);
    if (delivery.markedParts === delivery.parts) stats.add('duplicates');
    else if (delivery.markedParts === 0) {
      stats.add('counted');
      if (delivery.redelivered) stats.add('redelivered_unmarked');
    } else stats.add('partial_duplicates');
    this.finish(delivery.link, delivery.tag);
    for (const waiter of delivery.waiters) {
      this.metrics?.recordAck(waiter.receivedAt, waiter.publishedAt, wallNow, now);
      stats.add('duplicates');
      this.exposure?.occupied(waiter.link, waiter.tag, 1);
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
    this.link!.ack(acks.link, upTo);
    this.exposure?.acked(upTo);
  }

  private drained(): boolean {
    const load = this.lanes?.load;
    return (load === undefined || (load.pendingParts === 0 && load.busyLanes === 0)) && this.pendingDeadLetters === 0 && this.inFlight.size === 0;
  }

  /**
   * Stops consuming, finishes and acks what is in flight, then closes. Safe
   * to call twice: the second call returns the first one's promise.
   */
  stop(graceMs = this.config.shutdownGraceMs): Promise<void> {
    this.stopping ??= this.stopOnce(graceMs);
    return this.stopping;
  }

  private async stopOnce(graceMs: number): Promise<void> {
    const { log } = this;
    this.state = 'stopping';
    log.info({ graceMs }, 'stopping: no new deliveries, finishing what is in flight');
    try {
      await this.link?.stopConsuming();
    } catch (error) {
      log.warn({ err: describe(error) }, 'stop consuming failed');
    }
    const deadline = Date.now() + graceMs;
    this.lanes?.flushAll();
    while (!this.drained() && Date.now() < deadline) await sleep(20);
    if (!this.drained()) {
      log.warn({ inFlight: this.inFlight.size, ...this.lanes?.load }, 'grace period over; unfinished deliveries stay unacked and will be redelivered');
    }
    try {
      this.sendAcks();
    } catch (error) {
      log.warn({ err: describe(error) }, 'final ack failed');
    }
    this.lanes?.close();
    try {
      this.exposure?.stop();
      this.stats?.stop();
      await this.stats?.flush();
    } catch (error) {
      log.warn({ err: describe(error) }, 'final stats flush failed');
    }
    try {
      await this.link?.close();
    } catch (error) {
      log.warn({ err: describe(error) }, 'closing amqp failed');
    }
    try {
      await this.pools?.flushTelemetry();
      await this.pools?.destroy();
    } catch (error) {
      log.warn({ err: describe(error) }, 'stopping worker threads failed');
    }
    await this.heartbeat?.stop();
    try {
      await this.redis?.quit();
    } catch {
      this.redis?.disconnect();
    }
    try {
      await this.endpoints?.close();
      await this.meterProvider?.shutdown();
    } catch (error) {
      log.warn({ err: describe(error) }, 'closing the metrics endpoint failed');
    }
    this.state = 'stopped';
    log.info({ counters: this.stats?.sinceStart }, 'stopped');
  }
}
