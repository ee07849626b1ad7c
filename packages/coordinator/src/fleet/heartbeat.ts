/**
 * Each daemon's heartbeat under the prefix: one key per daemon,
 * `<prefix>daemon:<host>:<pid>:<random>`, holding a JSON record of what the
 * daemon is doing, set with a TTL of a few intervals and deleted on a clean
 * stop. A daemon that crashed disappears when its key expires. `tally status`
 * lists them.
 *
 * Every beat also renews the daemon's mode lease in the layout hash (see
 * layout-guard.ts), so a daemon of the other mode cannot switch the prefix
 * under a live one.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import type { Redis } from 'ioredis';
import type { RedisClient } from '@tally/runtime';
import { daemonKey, daemonScanPattern, describeError, type TallyMode, type TallySource } from '@tally/shared';
import { releaseModeLease, renewModeLease, type ModeLease } from './layout-guard.js';
import type { Logger } from '../process/logger.js';

/** How often a daemon beats by default (TALLY_HEARTBEAT_MS). */
export const HEARTBEAT_INTERVAL_MS = 5_000;
/** A heartbeat key (and a mode lease) outlives this many missed beats, then expires. */
export const HEARTBEAT_TTL_BEATS = 3;
export const HEARTBEAT_TTL_MS = HEARTBEAT_TTL_BEATS * HEARTBEAT_INTERVAL_MS;

/** What the daemon reports at each beat; supplied by the daemon as a callback. */
export interface HeartbeatSnapshot {
  readonly consuming: boolean;
  /** Seconds since the oldest unacked delivery was received; null when nothing is unacked. */
  readonly oldestUnackedS: number | null;
  /** Deliveries received and not yet acked. */
  readonly inFlight: number;
  /** The RabbitMQ node the daemon is connected to (a TALLY_AMQP_URL entry, redacted); null while it is not. */
  readonly amqpNode: string | null;
  /** TALLY_PARTITIONS > 1: the partitions it is subscribed to; absent with one queue. */
  readonly partitions?: readonly number[];
  /** The daemon is stopping: the others take its partitions over now, without waiting for its key to expire. */
  readonly leaving?: boolean;
}

/** The stored record. Field names are the JSON the key holds and `tally status --json` prints. */
export interface HeartbeatRecord {
  readonly id: string;
  readonly host: string;
  readonly pid: number;
  readonly mode: TallyMode;
  /** TALLY_SOURCE: a stream daemon's mode does not apply (`queue` in the records of daemons older than streams). */
  readonly source: TallySource;
  readonly version: string;
  readonly queue: string;
  readonly started_at: string;
  readonly consuming: boolean;
  readonly oldest_unacked_s: number | null;
  readonly in_flight: number;
  /** The broker node the daemon is connected to, redacted; null while it is not (and in the records of daemons older than this field). */
  readonly amqp_node: string | null;
  readonly last_beat: string;
  /** The key's TTL at each beat: with the key's remaining TTL it gives the last beat's age on the server's clock. */
  readonly ttl_ms: number;
  /** TALLY_PARTITIONS of the daemon (1 in the records of daemons older than partitions). */
  readonly partitions_total: number;
  /** The partitions it is subscribed to (partition-balancer.ts); empty with one queue. */
  readonly partitions: readonly number[];
  /** Stopping: no longer counted among the daemons that own partitions. */
  readonly leaving: boolean;
}

export interface HeartbeatOptions {
  readonly prefix: string;
  readonly mode: TallyMode;
  /** TALLY_SOURCE; `queue` when absent. */
  readonly source?: TallySource;
  readonly queue: string;
  readonly intervalMs?: number;
  readonly ttlMs?: number;
  /** TALLY_PARTITIONS; 1 when absent. */
  readonly partitions?: number;
  /** Called after each beat that reached Redis (partition-balancer.ts rebalances there); its failure is logged, never thrown. */
  readonly afterBeat?: () => Promise<void>;
}

/** `<host>:<pid>:<random>`: unique even when a pid is reused, or two containers share a host name and pid. */
export function newDaemonId(): string {
  return `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
}

function readVersion(): string {
  try {
    // dist/src/fleet/heartbeat.js -> packages/coordinator/package.json
    const json = JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version?: unknown };
    return typeof json.version === 'string' ? json.version : 'unknown';
  } catch {
    return 'unknown';
  }
}

/** The coordinator package's version, as the heartbeat reports it. */
export const TALLY_VERSION = readVersion();

/** Where the beat goes and what it reports. */
export interface HeartbeatDeps {
  readonly redis: RedisClient;
  /** What the daemon reports at each beat. */
  snapshot(): HeartbeatSnapshot;
  readonly log: Logger;
}

export class Heartbeat {
  readonly key: string;
  readonly lease: ModeLease;
  private readonly startedAt = new Date().toISOString();
  private readonly intervalMs: number;
  private timer: NodeJS.Timeout | null = null;
  private beating: Promise<void> | null = null;
  private failing = false;
  private again = false;
  private stopped = false;

  private readonly redis: RedisClient;
  private readonly snapshot: () => HeartbeatSnapshot;
  private readonly log: Logger;

  constructor(
    /** This daemon's id (newDaemonId), in its key and its mode lease. */
    readonly id: string,
    private readonly options: HeartbeatOptions,
    deps: HeartbeatDeps,
  ) {
    ({ redis: this.redis, snapshot: this.snapshot, log: this.log } = deps);
    this.key = daemonKey(options.prefix, id);
    this.intervalMs = options.intervalMs ?? HEARTBEAT_INTERVAL_MS;
    this.lease = Object.freeze({ holder: id, ttlMs: options.ttlMs ?? HEARTBEAT_TTL_BEATS * this.intervalMs });
  }

  record(): HeartbeatRecord {
    const snap = this.snapshot();
    return {
      id: this.id,
      host: hostname(),
      pid: process.pid,
      mode: this.options.mode,
      source: this.options.source ?? 'queue',
      version: TALLY_VERSION,
      queue: this.options.queue,
      started_at: this.startedAt,
      consuming: snap.consuming,
      oldest_unacked_s: snap.oldestUnackedS === null ? null : Math.round(snap.oldestUnackedS * 10) / 10,
      in_flight: snap.inFlight,
      amqp_node: snap.amqpNode,
      last_beat: new Date().toISOString(),
      ttl_ms: this.lease.ttlMs,
      partitions_total: this.options.partitions ?? 1,
      partitions: snap.partitions ?? [],
      leaving: snap.leaving ?? false,
    };
  }

  /** Beats now, then every interval until stopped. Never throws: a failed beat is logged and retried at the next one. */
  start(): void {
    if (this.timer !== null || this.stopped) return;
    void this.beatOnce();
    this.timer = setInterval(() => void this.beatOnce(), this.intervalMs);
    this.timer.unref();
  }

  /**
   * One beat. A call during a beat in progress gets one more beat after it,
   * so what changed meanwhile (the link coming up) is shown; beats never
   * overlap or pile up.
   */
  beatOnce(): Promise<void> {
    if (this.beating !== null) {
      this.again = true;
      return this.beating;
    }
    this.beating = (async () => {
      do {
        this.again = false;
        await this.beat();
      } while (this.again && !this.stopped);
    })().finally(() => {
      this.beating = null;
    });
    return this.beating;
  }

  private async beat(): Promise<void> {
    try {
      await this.redis.set(this.key, JSON.stringify(this.record()), 'PX', this.lease.ttlMs);
      await renewModeLease(this.redis, this.options.prefix, this.options.mode, this.lease);
      if (this.failing) this.log.info({ key: this.key }, 'heartbeat restored');
      this.failing = false;
      if (this.options.afterBeat !== undefined && !this.stopped) {
        await this.options
          .afterBeat()
          .catch((error: unknown) => this.log.warn({ err: describeError(error) }, 'partition rebalance failed; retrying at the next beat'));
      }
    } catch (error) {
      // Logged once per outage: the Redis outage itself is logged elsewhere.
      if (!this.failing) this.log.warn({ key: this.key, err: describeError(error) }, 'heartbeat failed; retrying at the next beat');
      this.failing = true;
    }
  }

  /** Stops beating and removes the key and the mode lease: a clean stop leaves no trace to expire. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    await this.beating;
    try {
      await this.redis.del(this.key);
      await releaseModeLease(this.redis, this.options.prefix, this.lease);
    } catch (error) {
      this.log.warn({ key: this.key, err: describeError(error) }, 'removing the heartbeat failed; it expires on its own');
    }
  }
}

/** A daemon as listed: its record, plus the last beat's age measured on the server's clock. */
export interface LiveDaemon extends HeartbeatRecord {
  readonly last_beat_age_s: number;
}

const MODES: readonly string[] = ['two-step', 'atomic'];

/**
 * Parses a stored record without trusting it: anything else under the
 * pattern (a foreign key, a half-written value) is skipped, not fatal.
 */
export function parseHeartbeat(raw: string, pttlMs: number): LiveDaemon | null {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    return null;
  }
  if (typeof value !== 'object' || value === null) return null;
  const r = value as Record<string, unknown>;
  const text = (v: unknown): v is string => typeof v === 'string' && v.length <= 512;
  const count = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= 0;
  if (!text(r.id) || !text(r.host) || !count(r.pid) || !text(r.mode) || !MODES.includes(r.mode) || !text(r.version) || !text(r.queue)) return null;
  if (!text(r.started_at) || typeof r.consuming !== 'boolean' || !(r.oldest_unacked_s === null || count(r.oldest_unacked_s))) return null;
  if (!count(r.in_flight) || !text(r.last_beat) || !count(r.ttl_ms)) return null;
  if (!(r.amqp_node === undefined || r.amqp_node === null || text(r.amqp_node))) return null;
  // Absent in the records of daemons older than partitions: one queue.
  const partitionsTotal = r.partitions_total === undefined ? 1 : r.partitions_total;
  if (!count(partitionsTotal) || !Number.isInteger(partitionsTotal)) return null;
  const partitions = r.partitions === undefined ? [] : r.partitions;
  if (!Array.isArray(partitions) || partitions.length > 1024 || !partitions.every((p) => Number.isInteger(p) && p >= 0)) return null;
  if (!(r.leaving === undefined || typeof r.leaving === 'boolean')) return null;
  if (!(r.source === undefined || r.source === 'queue' || r.source === 'stream')) return null;
  // The key is set with PX ttl_ms at each beat: what has run off the TTL is the time since.
  const ageMs = pttlMs >= 0 ? Math.max(0, r.ttl_ms - pttlMs) : 0;
  return {
    id: r.id,
    host: r.host,
    pid: r.pid,
    mode: r.mode as TallyMode,
    source: r.source === 'stream' ? 'stream' : 'queue',
    version: r.version,
    queue: r.queue,
    started_at: r.started_at,
    consuming: r.consuming,
    oldest_unacked_s: r.oldest_unacked_s,
    in_flight: r.in_flight,
    amqp_node: typeof r.amqp_node === 'string' ? r.amqp_node : null,
    last_beat: r.last_beat,
    ttl_ms: r.ttl_ms,
    partitions_total: partitionsTotal,
    partitions: partitions as number[],
    leaving: r.leaving === true,
    last_beat_age_s: Math.round(ageMs / 100) / 10,
  };
}

/**
 * Every live daemon of a prefix, read from the given nodes: on a standalone
 * Redis that is the one client; on a cluster, one client per master, since
 * each heartbeat key lives in its own slot. Keys are read one by one (GET and
 * PTTL in a pipeline per node), never with MGET, which a cluster node refuses
 * across slots. Sorted by host, then pid.
 */
export async function listDaemons(nodes: readonly Redis[], prefix: string): Promise<LiveDaemon[]> {
  const daemons: LiveDaemon[] = [];
  for (const node of nodes) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(cursor, 'MATCH', daemonScanPattern(prefix), 'COUNT', 1000);
      cursor = next;
      if (keys.length === 0) continue;
      const pipeline = node.pipeline();
      for (const key of keys) pipeline.get(key).pttl(key);
      const replies = (await pipeline.exec()) ?? [];
      for (let i = 0; i < keys.length; i++) {
        const [getError, raw] = replies[2 * i] ?? [null, null];
        const [, pttl] = replies[2 * i + 1] ?? [null, -2];
        if (getError || typeof raw !== 'string') continue; // expired between SCAN and GET, or not a string
        const daemon = parseHeartbeat(raw, Number(pttl));
        if (daemon !== null) daemons.push(daemon);
      }
    } while (cursor !== '0');
  }
  return daemons.sort((a, b) => (a.host === b.host ? a.pid - b.pid : a.host < b.host ? -1 : 1));
}
