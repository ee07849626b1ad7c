/**
 * With TALLY_REDIS_URL=redis+sentinel://…: which node is the primary, and
 * whether a failover is in progress, as the daemon reports it (/readyz, the
 * `tally.redis.failovers` counter, one log line per change).
 *
 * The clients follow a failover by themselves (redis-connection.ts,
 * sentinelOptions: they ask the Sentinels at every reconnect and subscribe
 * to +switch-master); this only watches, so that an operator sees a
 * failover as one, with the node names, rather than as "redis connection
 * down" followed by a recovery. It asks one Sentinel `SENTINEL MASTER` every
 * second (sentinel-query.ts) and compares the primary it names with the
 * node the daemon's connection reaches; shared/src/sentinel-state.ts
 * decides and words.
 */
import type { Redis } from 'ioredis';
import { isIP } from 'node:net';
import { PrimaryTracker, type PrimaryChange, type PrimaryState, type SentinelObservation, type SentinelTarget } from '@tally/shared';
import { nodeAddress, SentinelReader } from '@tally/runtime';
import type { Logger } from '../process/logger.js';

/** How often the Sentinels are asked: a failover takes seconds (down-after-milliseconds plus an election). */
export const SENTINEL_POLL_MS = 1_000;
/**
 * How often while the connection is down or a failover is in progress: the
 * window from "primary down" to the switch is often shorter than two slow
 * polls, and it is the moment an operator looks.
 */
export const SENTINEL_FAST_POLL_MS = 250;

export class SentinelWatch {
  private readonly tracker: PrimaryTracker;
  private readonly reader: SentinelReader;
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private started = false;
  private stopped = false;

  constructor(
    target: SentinelTarget,
    private readonly client: Redis,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {
    this.tracker = new PrimaryTracker(target.masterName);
    this.reader = new SentinelReader(target);
  }

  start(): void {
    if (this.started || this.stopped) return;
    this.started = true;
    const next = (): void => {
      if (this.stopped) return;
      const fast = this.client.status !== 'ready' || this.tracker.state.failoverInProgress;
      this.timer = setTimeout(() => void this.check().then(next), fast ? SENTINEL_FAST_POLL_MS : SENTINEL_POLL_MS);
      this.timer.unref();
    };
    void this.check().then(next);
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.reader.close();
  }

  get state(): PrimaryState {
    return this.tracker.state;
  }

  /** One look; concurrent calls share the one running. Never rejects. */
  check(): Promise<void> {
    this.running ??= this.checkOnce().finally(() => {
      this.running = null;
    });
    return this.running;
  }

  private async checkOnce(): Promise<void> {
    let observation: SentinelObservation;
    try {
      const answer = await this.reader.read();
      observation = { master: answer.master, sentinel: answer.sentinel, following: following(nodeAddress(this.client), answer.master.address) };
    } catch (error) {
      this.log.debug({ err: String(error) }, 'sentinel watch: no Sentinel answered');
      observation = { master: null, sentinel: null, following: null };
    }
    if (this.stopped) return;
    for (const change of this.tracker.observe(observation, this.now())) this.report(change);
  }

  private report(change: PrimaryChange): void {
    const { masterName } = this.tracker;
    switch (change.kind) {
      case 'failover-started':
        this.log.warn({ master: masterName, primary: this.tracker.state.primary }, `${change.reason}; batches wait, nothing unwritten is acked`);
        return;
      case 'switched':
        this.log.warn(
          { master: masterName, from: change.from, to: change.to, failovers: change.failovers },
          `redis primary of ${masterName} switched from ${change.from} to ${change.to} (Sentinel failover); the connections follow it`,
        );
        return;
      case 'failover-ended':
        this.log.info({ master: masterName, primary: change.primary, lastedMs: change.lastedMs }, `redis failover over: writing to ${change.primary}`);
        return;
      case 'sentinels-lost':
        this.log.warn({ master: masterName }, 'no Sentinel of TALLY_REDIS_URL answers: the primary is used as last named, but no failover can happen now');
        return;
      case 'sentinels-back':
        this.log.info({ master: masterName, sentinel: change.sentinel }, 'a Sentinel answers again');
        return;
    }
  }
}

/**
 * Whether the connection reaches the primary the Sentinels name: null when
 * it cannot be told (no connection now: readiness says so on its own; or
 * the Sentinels announce a host name, which the socket's peer address never
 * equals).
 */
export function following(connected: string | null, primary: string | null): boolean | null {
  if (connected === null || primary === null) return null;
  const host = primary.startsWith('[') ? primary.slice(1, primary.indexOf(']')) : primary.slice(0, primary.lastIndexOf(':'));
  if (isIP(host) === 0) return null;
  return connected === primary;
}
