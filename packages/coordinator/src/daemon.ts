/**
 * The daemon's lifecycle. What it is made of is runtime.ts (composition);
 * the path of a delivery is pipeline/ (intake → lanes → batches → settlement
 * → acks); the teardown is close-steps.ts. Here: the states, their
 * transitions, and the order of a stop.
 *
 *   created ──start()──► starting ──► running ──stop()──► stopping ──► stopped
 *                            │                                ▲
 *                            ├── failed: closes what it opened ──► stopped (start() rejects)
 *                            └── stop() meanwhile ────────────┘ (start() resolves without running)
 */
import { randomBytes } from 'node:crypto';
import { redactUrl, type CounterValues, type PrimaryState, type TallyConfig } from '@tally/shared';
import type { AmqpBrokerState } from './amqp/message-source.js';
import { CLOSE_BUDGET_MS, CloseSteps, runSteps, STEP_TIMEOUT_MS } from './process/close-steps.js';
import { newDaemonId } from './fleet/heartbeat.js';
import type { Logger } from './process/logger.js';
import type { DeliveryPipeline } from './pipeline/delivery-pipeline.js';
import { judgeReadiness, type ReadinessVerdict } from './telemetry/readiness.js';
import type { RedisProbeReport } from './redis/redis-probe.js';
import { openRuntime, StartInterrupted, type DaemonOptions, type Runtime } from './runtime.js';

export { CLOSE_BUDGET_MS } from './process/close-steps.js';
export type { DaemonOptions } from './runtime.js';

/**
 * Where the daemon is, with what exists in that state and nothing else:
 * - created: nothing opened yet;
 * - starting: collaborators being opened (their close steps are in `closeSteps`);
 * - running: everything open, deliveries flowing;
 * - stopping: a stop in progress (`runtime` and `pipeline` null when it came during the start);
 * - stopped: everything closed; `counters` are what this run added, when it ran.
 */
type Lifecycle =
  | { readonly state: 'created' }
  | { readonly state: 'starting' }
  | { readonly state: 'running'; readonly runtime: Runtime; readonly pipeline: DeliveryPipeline }
  | { readonly state: 'stopping'; readonly runtime: Runtime | null; readonly pipeline: DeliveryPipeline | null; readonly done: Promise<void> }
  | { readonly state: 'stopped'; readonly counters: CounterValues | null };

export type DaemonState = Lifecycle['state'];

/** The failover in progress that /readyz names, if any. */
function failoverOf(primary: PrimaryState | null): { reason: string; sinceMs: number | null } | null {
  return primary === null || primary.reason === null ? null : { reason: primary.reason, sinceMs: primary.sinceMs };
}

export class Daemon {
  private lifecycle: Lifecycle = { state: 'created' };
  /** The teardown of whatever has been opened: filled by the openers (runtime.ts), run by a failed start and by a stop. */
  private readonly closeSteps: CloseSteps;
  /** The shutdown step running now, for main.ts's backstop to name. */
  private stopStep: string | null = null;
  /** This daemon's id in its heartbeat key and mode lease. */
  readonly daemonId = newDaemonId();
  /** Names this daemon's two-step claims (new at every start: a restarted daemon waits out its predecessor's claims like anyone's). */
  private readonly claimToken = randomBytes(8).toString('hex');

  constructor(
    private readonly config: TallyConfig,
    private readonly log: Logger,
    private readonly options: DaemonOptions = {},
  ) {
    this.closeSteps = new CloseSteps(log);
  }

  /** Every transition, logged: the state names the line's `state` field. */
  private enter(next: Lifecycle, message: string, fields: Record<string, unknown> = {}): void {
    const from = this.lifecycle.state;
    this.lifecycle = next;
    this.log.info({ ...fields, from, state: next.state }, message);
  }

  /** Still starting: a stop that came meanwhile moved the state on (a method, so the check is made anew at each call). */
  private stillStarting(): boolean {
    return this.lifecycle.state === 'starting';
  }

  /** Runtime and pipeline while they exist (running, or stopping after a run). */
  private get open(): { runtime: Runtime; pipeline: DeliveryPipeline } | null {
    const lifecycle = this.lifecycle;
    if (lifecycle.state === 'running') return lifecycle;
    if (lifecycle.state === 'stopping' && lifecycle.runtime !== null && lifecycle.pipeline !== null)
      return { runtime: lifecycle.runtime, pipeline: lifecycle.pipeline };
    return null;
  }

  /** The port the HTTP endpoint listens on, once started (TALLY_METRICS_PORT=0 picks one). */
  get metricsPort(): number | null {
    return this.open?.runtime.telemetry?.port ?? null;
  }

  get status(): {
    state: DaemonState;
    consuming: boolean;
    redisReady: boolean;
    /** Messages with parts not yet written (tally_deliveries_in_flight counts deliveries not yet acked: a written one waits for its ack). */
    messagesInProgress: number;
    oldestUnackedS: number | null;
    redis: RedisProbeReport | null;
    /** Behind Sentinel: the primary, any failover in progress, failovers seen (sentinel-state.ts); null otherwise. */
    redisPrimary: PrimaryState | null;
    amqp: AmqpBrokerState | null;
  } {
    const open = this.open;
    const ageMs = open?.pipeline.oldestUnackedAgeMs() ?? null;
    return {
      state: this.lifecycle.state,
      consuming: open?.runtime.source.consuming ?? false,
      redisReady: open?.runtime.redis.client.status === 'ready',
      messagesInProgress: open?.pipeline.messagesInProgress ?? 0,
      oldestUnackedS: ageMs === null ? null : Math.round(ageMs) / 1000,
      redis: open?.runtime.redis.probe ?? null,
      redisPrimary: open?.runtime.redis.sentinelWatch?.state ?? null,
      amqp: open?.runtime.source.brokerState ?? null,
    };
  }

  /** What /readyz answers: running, connected, consuming, Redis accepting writes, no stalled head (readiness.ts). */
  get readiness(): ReadinessVerdict {
    const status = this.status;
    const open = this.open;
    return judgeReadiness({
      state: status.state,
      consuming: status.consuming,
      redisConnected: status.redisReady,
      refusal: open?.runtime.redis.health.current() ?? null,
      failover: failoverOf(status.redisPrimary),
      replicasShort: open?.runtime.redis.replicaWatch?.short ?? [],
      refusedPartitions: open?.runtime.source.refusedPartitions ?? [],
      oldestUnackedMs: open?.pipeline.oldestUnackedAgeMs() ?? null,
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

  /**
   * Opens everything and starts consuming. Rejects when the start fails,
   * after closing what it had opened (the daemon is then stopped). Resolves
   * without running when stop() came meanwhile.
   */
  async start(): Promise<void> {
    if (this.lifecycle.state !== 'created') throw new Error(`start() called in state ${this.lifecycle.state}`);
    const { config } = this;
    this.enter({ state: 'starting' }, 'starting', {
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
    });
    let opened: { runtime: Runtime; pipeline: DeliveryPipeline };
    try {
      opened = await openRuntime({
        config,
        log: this.log,
        daemonId: this.daemonId,
        claimToken: this.claimToken,
        closeSteps: this.closeSteps,
        options: this.options,
        interrupted: () => !this.stillStarting(),
        stopping: () => this.lifecycle.state === 'stopping',
        readyz: () => {
          const verdict = this.readiness;
          return { ready: verdict.ready, detail: { reason: verdict.reason, since: verdict.since, ...this.status } };
        },
      });
      // Threads ready before the first delivery: no prefetch window held while they start.
      await opened.runtime.threads.warm();
      if (!this.stillStarting()) throw new StartInterrupted();
      await opened.runtime.source.start();
    } catch (error) {
      // A stop came meanwhile: it closes what it finds; anything opened since is closed here, after it.
      const interrupted = !this.stillStarting();
      await this.closeSteps.close(() => {}, performance.now() + CLOSE_BUDGET_MS);
      if (interrupted) return;
      this.enter({ state: 'stopped', counters: null }, 'start failed; what it had opened is closed');
      throw error;
    }
    // The link stops connecting when a stop closes it: the start then ends here.
    if (!this.stillStarting()) return;
    const { runtime, pipeline } = opened;
    this.enter({ state: 'running', runtime, pipeline }, 'running');
    pipeline.startStallChecks();
    void runtime.fleet.heartbeat.beatOnce(); // show "consuming" now, not at the next interval
  }

  /**
   * Stops consuming, finishes and acks what is in flight, then closes. Safe
   * to call twice and in any state: a second call returns the first one's
   * promise; before start() or after the stop it does nothing.
   */
  stop(graceMs = this.config.shutdownGraceMs): Promise<void> {
    const lifecycle = this.lifecycle;
    switch (lifecycle.state) {
      case 'stopping':
        return lifecycle.done;
      case 'stopped':
        return Promise.resolve();
      case 'created':
        this.enter({ state: 'stopped', counters: null }, 'stopped');
        return Promise.resolve();
      case 'starting':
      case 'running': {
        const open = lifecycle.state === 'running' ? lifecycle : null;
        let finish!: () => void;
        const done = new Promise<void>((resolve) => (finish = resolve));
        this.enter(
          { state: 'stopping', runtime: open?.runtime ?? null, pipeline: open?.pipeline ?? null, done },
          'stopping: no new deliveries, finishing what is in flight',
          {
            graceMs,
          },
        );
        void this.stopOnce(open, graceMs).then(finish, (error: unknown) => {
          this.log.warn({ err: String(error) }, 'stop failed');
          finish();
        });
        return done;
      }
    }
  }

  /**
   * The stop: within the grace period, stop the flow and finish and ack what
   * can be; after it, the close steps (close-steps.ts), each bounded, in
   * total by CLOSE_BUDGET_MS. Each step is guarded on its own: one that fails
   * is logged by name and the next one still runs.
   */
  private async stopOnce(open: { runtime: Runtime; pipeline: DeliveryPipeline } | null, graceMs: number): Promise<void> {
    const { log } = this;
    const graceEndsAt = performance.now() + graceMs;
    const progress = (step: string | null) => {
      this.stopStep = step;
    };
    if (open !== null) {
      const { runtime, pipeline } = open;
      pipeline.stopStallChecks();
      await runSteps(
        [
          {
            name: 'stop consuming',
            run: async () => {
              await runtime.source.stopConsuming(Math.min(STEP_TIMEOUT_MS, graceMs));
              // With partitions the beat says `leaving`: the others take this daemon's partitions at their next beat.
              void runtime.fleet.heartbeat.beatOnce();
            },
          },
          {
            name: 'finishing in-flight deliveries',
            run: async () => {
              pipeline.flushAll();
              if (!(await pipeline.drainWithin(Math.max(0, graceEndsAt - performance.now())))) {
                log.warn(
                  { messagesInProgress: pipeline.messagesInProgress, ...pipeline.laneLoad },
                  'grace period over; unfinished deliveries stay unacked and will be redelivered',
                );
              }
            },
          },
          { name: 'final ack', run: () => pipeline.sendAcks() },
          { name: 'closing the shard lanes', run: () => pipeline.close() },
        ],
        log,
        progress,
      );
    }
    // The threads stop before the channel closes (CLOSE_ORDER says why).
    await this.closeSteps.close(progress, Math.max(performance.now(), graceEndsAt) + CLOSE_BUDGET_MS);
    const counters = open?.runtime.counters.stats.sinceStart ?? null;
    this.enter({ state: 'stopped', counters }, 'stopped', { counters: counters ?? undefined });
  }
}
