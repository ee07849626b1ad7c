/**
 * With TALLY_REDIS_WAIT_REPLICAS = N > 0: watches whether every master that
 * holds a virtual shard has N replicas online, so that a WAIT that cannot be
 * met is named instead of showing, a minute and a half later, only as a
 * stalled head ("oldest unacked delivery 88 s old").
 *
 * The batches themselves stay strict (replica-wait.ts: a WAIT that times out
 * is retried, nothing is acked that the replicas do not have); this only
 * makes the cause visible:
 *
 * - /readyz: 503, naming the master (host:port, as the client reaches it) and
 *   its shards (readiness.ts);
 * - the gauge tally.redis.replicas_short per master (telemetry/safety-gauges.ts);
 * - one log line when a master becomes short, one when it is no longer.
 *
 * Why a check of its own, in the coordinator, rather than the threads'
 * reports: a WAIT that times out says only "fewer than N acknowledged in
 * time", the same for a replica that is slow, stopped or gone, and a thread
 * knows nothing of the other masters. `INFO replication` on each master
 * says how many replicas it has (shared/src/replica-shortfall.ts decides),
 * and the slot map says which shards each master holds. It costs one INFO
 * per master every CHECK_INTERVAL_MS, and one more, at most once a second,
 * when a thread reports a WAIT timeout (nudge), so the condition shows
 * within about one WAIT timeout of the first batch it holds.
 */
import type { Cluster, Redis } from 'ioredis';
import { isCluster, keySlot, nodeAddress, whenClusterReady, type RedisClient } from '@tally/runtime';
import { describeError, describeShortMaster, findShortMasters, replicationFromInfo, shortfallChanges, type ShortMaster } from '@tally/shared';
import type { Logger } from '../process/logger.js';

/** How often the masters are asked when nothing else prompts it. */
export const CHECK_INTERVAL_MS = 5_000;
/** The least time between two checks that a nudge starts. */
export const NUDGE_MIN_GAP_MS = 1_000;

export interface ReplicaWatchOptions {
  /** TALLY_REDIS_WAIT_REPLICAS. */
  readonly wanted: number;
  readonly virtualShards: number;
  readonly intervalMs?: number;
}

/** A short master and since when (epoch ms) it has been short. */
export type ShortMasterSince = ShortMaster & { readonly sinceMs: number };

export class ReplicaWatch {
  private shortNow: ShortMasterSince[] = [];
  /** Every master of the last check that answered, by address: its online replicas. */
  private known = new Map<string, number>();
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private lastCheckMs = 0;
  private stopped = false;

  constructor(
    private readonly redis: RedisClient,
    private readonly options: ReplicaWatchOptions,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {}

  start(): void {
    if (this.timer !== null || this.stopped) return;
    void this.check();
    this.timer = setInterval(() => void this.check(), this.options.intervalMs ?? CHECK_INTERVAL_MS);
    this.timer.unref();
  }

  /** A thread's WAIT timed out: check now, unless a check ran within the last second. */
  nudge(): void {
    if (this.now() - this.lastCheckMs >= NUDGE_MIN_GAP_MS) void this.check();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** The masters that cannot meet the WAIT now, sorted by address. */
  get short(): readonly ShortMasterSince[] {
    return this.shortNow;
  }

  /** Replicas missing for the WAIT, by master address, for every master the last check reached or knows to be short. */
  shortfallByMaster(): Map<string, number> {
    const shortfall = new Map<string, number>();
    for (const [address, replicas] of this.known) shortfall.set(address, Math.max(0, this.options.wanted - replicas));
    for (const master of this.shortNow) shortfall.set(master.address, master.wanted - master.replicas);
    return shortfall;
  }

  /** One check; concurrent calls share the one running. Never rejects. */
  check(): Promise<void> {
    if (this.running === null) {
      this.lastCheckMs = this.now();
      this.running = this.checkOnce().finally(() => {
        this.running = null;
      });
    }
    return this.running;
  }

  private async checkOnce(): Promise<void> {
    try {
      // A cluster client starts without its slot map: the first check (at start) waits for it rather than see no master.
      if (isCluster(this.redis) && this.redis.status !== 'ready') await whenClusterReady(this.redis);
      const topology = this.topology();
      // Behind Sentinel with no connection now (a failover): nothing to ask, and nothing learned; the next check will know.
      if (topology === null) return;
      const { owners, connections } = topology;
      const replicas = new Map<string, number | null>();
      await Promise.all(
        [...connections].map(async ([address, connection]) => {
          replicas.set(address, await this.onlineReplicas(address, connection));
        }),
      );
      if (this.stopped) return;
      this.apply(findShortMasters(this.options.wanted, owners, replicas, this.shortNow), owners, replicas);
    } catch (error) {
      // The watch must never take the daemon down; an outage shows through redis-health.ts.
      this.log.warn({ err: describeError(error) }, 'replica check failed; trying again at the next interval');
    }
  }

  /** Which master serves each virtual shard, and a connection to each; null while a client behind Sentinel reaches no node. */
  private topology(): { owners: (string | undefined)[]; connections: Map<string, Redis | null> } | null {
    const shards = Array.from({ length: this.options.virtualShards }, (_, shard) => shard);
    if (!isCluster(this.redis)) {
      // Behind Sentinel the node is the primary of the moment: a failover makes the old one "no longer serving".
      const address = nodeAddress(this.redis);
      if (address === null) return null;
      return { owners: shards.map(() => address), connections: new Map([[address, this.redis]]) };
    }
    const cluster: Cluster = this.redis;
    // The slot map names a slot's master first (host:port as ioredis reaches it).
    const owners = shards.map((shard) => cluster.slots[keySlot(`{${shard}}`)]?.[0]);
    const nodes = new Map(cluster.nodes('master').map((node) => [nodeAddress(node)!, node]));
    const connections = new Map<string, Redis | null>();
    for (const address of owners) if (address !== undefined) connections.set(address, nodes.get(address) ?? null);
    return { owners, connections };
  }

  /** Online replicas of one master, or null when it cannot be told now (no connection, no answer, not a master). */
  private async onlineReplicas(address: string, connection: Redis | null): Promise<number | null> {
    if (connection === null) {
      this.refreshSlots();
      return null;
    }
    try {
      const replication = replicationFromInfo(await connection.info('replication'));
      if (replication.role === 'master') return replication.onlineReplicas;
      // A replica where the slot map says master: the map is stale (a failover); ask again once it is refreshed.
      this.refreshSlots();
      return null;
    } catch (error) {
      this.refreshSlots();
      this.log.debug({ master: address, err: describeError(error) }, 'replica check: master did not answer INFO replication');
      return null;
    }
  }

  private refreshSlots(): void {
    if (isCluster(this.redis)) this.redis.refreshSlotsCache();
  }

  private apply(after: ShortMaster[], owners: readonly (string | undefined)[], replicas: ReadonlyMap<string, number | null>): void {
    const now = this.now();
    const { started, cleared } = shortfallChanges(this.shortNow, after);
    const since = new Map(this.shortNow.map((master) => [master.address, master.sinceMs]));
    this.shortNow = after.map((master) => ({ ...master, sinceMs: since.get(master.address) ?? now }));
    this.known = new Map([...replicas].filter((entry): entry is [string, number] => entry[1] !== null));
    for (const master of started) {
      this.log.warn({ master: master.address, replicas: master.replicas, wanted: master.wanted, shards: master.shards.length }, describeShortMaster(master));
    }
    const holding = new Set(owners);
    for (const master of cleared) {
      const lastedMs = now - (since.get(master.address) ?? now);
      const replicasNow = replicas.get(master.address) ?? null;
      this.log.info(
        { master: master.address, replicas: replicasNow, wanted: this.options.wanted, lastedMs },
        holding.has(master.address)
          ? `redis master ${master.address} has ${replicasNow} online replica(s) again: WAIT for ${this.options.wanted} can be met, its shards' batches are acked again`
          : `redis master ${master.address} no longer serves any virtual shard (failed over or resharded): its WAIT shortfall no longer holds anything`,
      );
    }
  }
}

/** The daemon's watch, started; null when TALLY_REDIS_WAIT_REPLICAS is 0 (no WAIT, nothing to watch). */
export function startReplicaWatch(
  redis: RedisClient,
  config: { readonly redisWaitReplicas: number; readonly virtualShards: number },
  log: Logger,
): ReplicaWatch | null {
  if (config.redisWaitReplicas <= 0) return null;
  const watch = new ReplicaWatch(redis, { wanted: config.redisWaitReplicas, virtualShards: config.virtualShards }, log);
  watch.start();
  return watch;
}
