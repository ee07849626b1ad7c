/**
 * What the Sentinels say of the primary, followed over time: which node is
 * the primary, whether a failover is in progress, how many failovers the
 * daemon has seen. Pure: the daemon's watch (coordinator/src/redis/
 * sentinel-watch.ts) and `tally status` ask the Sentinels, this decides and
 * words it.
 *
 * A failover is in progress while the answering Sentinel flags the primary
 * down (s_down: it alone thinks so; o_down: a quorum agrees) or failing over,
 * and after the switch until the daemon's own connection reaches the new
 * primary. A failover is counted when the primary's address changes: the
 * one fact every Sentinel agrees on after `+switch-master`, whichever of
 * them answers, and the one a poll cannot miss (a switch A → B → A between
 * two polls one second apart would need two elections within that second).
 */

/** Flags of `SENTINEL MASTER` that mean the primary is down or being replaced. */
const FAILOVER_FLAGS: readonly string[] = Object.freeze(['s_down', 'o_down', 'failover_in_progress']);

/** The fields of a `SENTINEL MASTER <name>` reply that Tally reads. */
export interface SentinelMasterInfo {
  /** `ip:port` the Sentinel names as the primary. */
  readonly address: string | null;
  readonly flags: readonly string[];
  /** `num-slaves`: the replicas the Sentinel knows (up or not). */
  readonly replicas: number;
  /** `num-other-sentinels` + 1: the Sentinels that monitor the master, as this one knows them. */
  readonly sentinels: number;
  readonly quorum: number | null;
}

/** A `SENTINEL MASTER` reply (a flat field/value array, RESP2) read into its fields. */
export function sentinelMasterFromReply(reply: unknown): SentinelMasterInfo {
  const fields = new Map<string, string>();
  if (Array.isArray(reply)) for (let i = 0; i + 1 < reply.length; i += 2) fields.set(String(reply[i]), String(reply[i + 1]));
  const ip = fields.get('ip');
  const port = fields.get('port');
  const number = (name: string): number | null => {
    const value = Number(fields.get(name));
    return fields.has(name) && Number.isInteger(value) ? value : null;
  };
  return {
    address: ip === undefined || port === undefined ? null : joinAddress(ip, port),
    flags: (fields.get('flags') ?? '').split(',').filter((flag) => flag !== ''),
    replicas: number('num-slaves') ?? 0,
    sentinels: (number('num-other-sentinels') ?? 0) + 1,
    quorum: number('quorum'),
  };
}

/** `host:port`, an IPv6 host in brackets. */
export function joinAddress(host: string, port: string | number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** The flags that say a failover is under way, in the order Sentinel gives them. */
export function failoverFlags(flags: readonly string[]): string[] {
  return flags.filter((flag) => FAILOVER_FLAGS.includes(flag));
}

/** One look at the Sentinels and at the daemon's own connection. */
export interface SentinelObservation {
  /** The primary as the first Sentinel that answered names it; null when none answered. */
  readonly master: SentinelMasterInfo | null;
  /** The Sentinel that answered (`host:port`). */
  readonly sentinel: string | null;
  /**
   * Whether the daemon's connection reaches that primary: false while it
   * still reconnects after a switch, null when it cannot be told (the
   * Sentinels announce host names, or the connection is down).
   */
  readonly following: boolean | null;
}

export interface PrimaryState {
  readonly masterName: string;
  /** The current primary (`host:port`); the last known one while no Sentinel answers; null before any answered. */
  readonly primary: string | null;
  readonly failoverInProgress: boolean;
  /** Why a failover is said to be in progress (for /readyz and the log); null when none is. */
  readonly reason: string | null;
  /** Epoch ms the failover in progress was first seen. */
  readonly sinceMs: number | null;
  /** Primary switches seen since the daemon started: the `tally.redis.failovers` counter. */
  readonly failovers: number;
  /** Whether the last look reached a Sentinel. */
  readonly sentinelsAnswer: boolean;
  readonly sentinel: string | null;
  readonly replicas: number | null;
}

export type PrimaryChange =
  | { readonly kind: 'failover-started'; readonly reason: string }
  | { readonly kind: 'switched'; readonly from: string; readonly to: string; readonly failovers: number }
  | { readonly kind: 'failover-ended'; readonly primary: string; readonly lastedMs: number }
  | { readonly kind: 'sentinels-lost' }
  | { readonly kind: 'sentinels-back'; readonly sentinel: string };

/** Follows the primary from one observation to the next; the changes are what the watch logs. */
export class PrimaryTracker {
  private primary: string | null = null;
  private failovers = 0;
  private reason: string | null = null;
  private sinceMs: number | null = null;
  private answered = true;
  private sentinel: string | null = null;
  private replicas: number | null = null;

  constructor(readonly masterName: string) {}

  observe(observation: SentinelObservation, nowMs: number): PrimaryChange[] {
    const changes: PrimaryChange[] = [];
    const { master } = observation;
    if (master === null || master.address === null) {
      // No Sentinel answers: nothing new is known about the primary, and no failover can happen without them.
      if (this.answered) changes.push({ kind: 'sentinels-lost' });
      this.answered = false;
      return changes;
    }
    if (!this.answered) changes.push({ kind: 'sentinels-back', sentinel: observation.sentinel ?? 'a Sentinel' });
    this.answered = true;
    this.sentinel = observation.sentinel;
    this.replicas = master.replicas;
    if (this.primary !== null && master.address !== this.primary) {
      this.failovers++;
      changes.push({ kind: 'switched', from: this.primary, to: master.address, failovers: this.failovers });
    }
    this.primary = master.address;

    const down = failoverFlags(master.flags);
    const reason =
      down.length > 0
        ? `redis failover in progress: the Sentinels see primary ${master.address} of ${this.masterName} as ${down.join(', ')}`
        : observation.following === false
          ? `redis failover in progress: reconnecting to ${this.masterName}'s primary ${master.address}`
          : null;
    if (reason !== null && this.reason === null) {
      this.sinceMs = nowMs;
      changes.push({ kind: 'failover-started', reason });
    } else if (reason === null && this.reason !== null) {
      changes.push({ kind: 'failover-ended', primary: master.address, lastedMs: nowMs - (this.sinceMs ?? nowMs) });
      this.sinceMs = null;
    }
    this.reason = reason;
    return changes;
  }

  get state(): PrimaryState {
    return {
      masterName: this.masterName,
      primary: this.primary,
      failoverInProgress: this.reason !== null,
      reason: this.reason,
      sinceMs: this.sinceMs,
      failovers: this.failovers,
      sentinelsAnswer: this.answered,
      sentinel: this.sentinel,
      replicas: this.replicas,
    };
  }
}
