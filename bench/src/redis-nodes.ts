/**
 * The Redis servers a drain measures, one client per server: the one
 * standalone server, or a Redis Cluster's masters (where every write lands)
 * and its replicas (a copy of their masters' data, reported apart). INFO is
 * per server, so a cluster's figures are sums over its masters; the sums
 * themselves are pure (redis-info.ts).
 */
import { Redis } from 'ioredis';
import { parseInfo } from '@tally/shared';
import { commandCalls, commandUsec, errorCounts, keyspaceStats, sumCpuSeconds, sumInfoField, sumPerName } from './redis-info.js';

export interface RedisNodes {
  readonly topology: 'standalone' | 'cluster';
  readonly masters: readonly Redis[];
  readonly replicas: readonly Redis[];
}

export function standaloneNodes(redis: Redis): RedisNodes {
  return { topology: 'standalone', masters: [redis], replicas: [] };
}

/**
 * Clients of a cluster's nodes by the roles the cluster reported when asked:
 * the bench fails nothing over, so they hold for the run. The caller
 * disconnects them (disconnectNodes).
 */
export function clusterNodes(masterUrls: readonly string[], replicaUrls: readonly string[]): RedisNodes {
  const client = (url: string) => new Redis(url, { connectionName: 'tally-bench-info', maxRetriesPerRequest: 1 });
  return { topology: 'cluster', masters: masterUrls.map(client), replicas: replicaUrls.map(client) };
}

export function disconnectNodes(nodes: RedisNodes): void {
  if (nodes.topology !== 'cluster') return; // a standalone node is the caller's own control client
  for (const node of [...nodes.masters, ...nodes.replicas]) node.disconnect();
}

async function infos(servers: readonly Redis[], section: string): Promise<Array<Map<string, string>>> {
  return Promise.all(servers.map(async (server) => parseInfo(await server.info(section))));
}

export interface MemorySample {
  /** used_memory summed over the masters (the standalone server). */
  readonly masters: number;
  /** used_memory of each master, in the order of RedisNodes.masters. */
  readonly perMaster: readonly number[];
  /** mem_replication_backlog summed over the masters (0 without replicas): part of `masters`. */
  readonly replicationBacklog: number;
  /** used_memory summed over the replicas; null without any. */
  readonly replicas: number | null;
  /** Keys on the masters, and their keyspace hash tables' bytes (part of `masters`), from MEMORY STATS. */
  readonly keys: number;
  readonly hashtableBytes: number;
  readonly slotToKeysBytes: number;
}

export async function sampleMemory(nodes: RedisNodes): Promise<MemorySample> {
  const [masters, replicas, keyspaces] = await Promise.all([
    infos(nodes.masters, 'memory'),
    infos(nodes.replicas, 'memory'),
    Promise.all(nodes.masters.map(async (master) => keyspaceStats(await master.call('MEMORY', 'STATS')))),
  ]);
  const total = (field: 'keys' | 'hashtableBytes' | 'slotToKeysBytes') => keyspaces.reduce((sum, k) => sum + k[field], 0);
  return {
    keys: total('keys'),
    hashtableBytes: total('hashtableBytes'),
    slotToKeysBytes: total('slotToKeysBytes'),
    masters: sumInfoField(masters, 'used_memory'),
    perMaster: masters.map((info) => sumInfoField([info], 'used_memory')),
    replicationBacklog: sumInfoField(masters, 'mem_replication_backlog'),
    replicas: nodes.replicas.length === 0 ? null : sumInfoField(replicas, 'used_memory'),
  };
}

/** CPU seconds the masters (the standalone server) and, apart, the replicas have used so far (INFO cpu). */
export async function sampleCpu(nodes: RedisNodes): Promise<{ readonly masters: number; readonly replicas: number | null }> {
  const [masters, replicas] = await Promise.all([infos(nodes.masters, 'cpu'), infos(nodes.replicas, 'cpu')]);
  return { masters: sumCpuSeconds(masters), replicas: nodes.replicas.length === 0 ? null : sumCpuSeconds(replicas) };
}

/**
 * Calls and microseconds per command, added up over the masters: what the clients sent (a replica only applies its
 * master's stream). One INFO per master.
 */
export async function sampleCommands(nodes: RedisNodes): Promise<{ readonly calls: Map<string, number>; readonly usec: Map<string, number> }> {
  const perMaster = await infos(nodes.masters, 'commandstats');
  return { calls: sumPerName(perMaster.map(commandCalls)), usec: sumPerName(perMaster.map(commandUsec)) };
}

/** Error replies per prefix, added up over the masters (INFO errorstats; sampled outside the drain's command count). */
export async function sampleErrors(nodes: RedisNodes): Promise<Map<string, number>> {
  return sumPerName((await infos(nodes.masters, 'errorstats')).map(errorCounts));
}

/** FLUSHALL on every master; a cluster's replicas follow by replication (settleReplicas waits for them). */
export async function flushMasters(nodes: RedisNodes): Promise<void> {
  await Promise.all(nodes.masters.map((master) => master.flushall()));
}

/**
 * redis-server arguments of the bench's own servers: DEBUG from loopback
 * only, for waitForRehash.
 */
export const BENCH_SERVER_ARGS: readonly string[] = Object.freeze(['--enable-debug-command', 'local']);

/** cron ticks per second while waitForRehash waits on the bench's own servers: the server rehashes 1 ms per tick. */
const REHASH_HZ = 500;

/**
 * Waits (up to two minutes) until no master is rehashing its keyspace
 * (DEBUG HTSTATS 0 names no "rehashing target"). A fill ends with its
 * keyspace's main and expires dictionaries growing (the last doubling
 * started at a power of two of keys, and only as many buckets moved as keys
 * were added since), and the server moves the rest 1 ms per cron tick: on a
 * cluster master holding 562,500 of a reference fill's 1.8M keys that took
 * tens of seconds at the default 10 ticks a second, and each old table freed
 * (4.2 MB) and the CPU moving it landed in the drain (one reference drain
 * read -246 B and twice its fresh Redis CPU per message). A production
 * keyspace of that size is past its growth. On the bench's own servers
 * (`ownServers`) the wait raises `hz` to REHASH_HZ and puts it back after.
 * Resolves false on a server that refuses DEBUG: then nothing is waited for.
 */
export async function waitForRehash(nodes: RedisNodes, ownServers: boolean, timeoutMs = 120_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  const rehashing = async (redis: Redis) => String(await redis.call('DEBUG', 'HTSTATS', '0')).includes('rehashing target');
  for (const redis of nodes.masters) {
    try {
      if (!(await rehashing(redis))) continue;
    } catch {
      return false;
    }
    const hz = ownServers ? ((await redis.config('GET', 'hz')) as string[])[1] : undefined;
    if (hz !== undefined) await redis.config('SET', 'hz', String(REHASH_HZ));
    try {
      while ((await rehashing(redis)) && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50));
    } finally {
      if (hz !== undefined) await redis.config('SET', 'hz', hz);
    }
  }
  return true;
}

/**
 * Waits (up to a minute) until every master has freed what UNLINK handed to
 * its background thread (INFO memory lazyfree_pending_objects). A reset
 * deletes the prefix of the drain before with UNLINK; after a steady-state
 * drain that is hundreds of MB, and its freeing, left to run on, would show
 * in the next drain as memory given back and as CPU (the lazy-free thread is
 * the server's own: one fresh drain after a 7M-marker prefix read -2,173 B
 * and +25 µs of Redis CPU per message).
 */
export async function waitForLazyFree(nodes: RedisNodes): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (const redis of nodes.masters) {
    while (Date.now() < deadline) {
      const pending = Number(parseInfo(await redis.info('memory')).get('lazyfree_pending_objects') ?? 0);
      if (!(pending > 0)) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

/**
 * Waits until every master's replicas have acknowledged its replication
 * stream (WAIT for each master's connected replicas), so that a memory
 * sample of the replicas holds what their masters hold. A no-op on a
 * standalone server.
 */
export async function settleReplicas(nodes: RedisNodes, timeoutMs = 5_000): Promise<void> {
  if (nodes.replicas.length === 0) return;
  await Promise.all(
    nodes.masters.map(async (master) => {
      const replicas = sumInfoField([parseInfo(await master.info('replication'))], 'connected_slaves');
      if (replicas > 0) await master.wait(replicas, timeoutMs);
    }),
  );
}
