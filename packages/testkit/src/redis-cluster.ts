/**
 * A Redis Cluster of the test's own: N masters with R replicas each, from the
 * installed redis-server, on free loopback ports, created with
 * `redis-cli --cluster create`. It takes seconds; `stop()` kills every process
 * it started and removes its directory.
 *
 * The node timeout is short (1 s by default, 15 s in Redis) so a SIGKILLed
 * master is replaced by its replica within a few seconds, and replicas may
 * always be promoted (validity factor 0) however long the test ran: the
 * failover scenarios test Tally, not Redis's election rules.
 *
 * With `tls`, every node listens for TLS only (`--port 0 --tls-port`), and
 * the cluster bus and replication speak TLS too (`--tls-cluster yes`,
 * `--tls-replication yes`): the cluster then announces its TLS ports, and any
 * client that works proves TLS was spoken to every node it reached.
 */
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { parseClusterNodes, type ClusterNodeLine } from './cluster-nodes.js';
import { freePorts } from './free-port.js';
import { parseInfo } from '@tally/shared';
import { adminClientOptions, killAllSync, spawnRedis, type RedisProcess, type RedisTlsFiles } from './redis-process.js';

const run = promisify(execFile);

export const CLUSTER_SLOTS = 16384;

export interface RedisClusterOptions {
  /** Masters (3 by default; Redis needs at least 3). */
  readonly masters?: number;
  /** Replicas per master (1 by default). */
  readonly replicasPerMaster?: number;
  /** cluster-node-timeout in ms: how soon a silent master is failed over (1000 by default). */
  readonly nodeTimeoutMs?: number;
  /** appendonly yes + appendfsync always on every node, instead of no persistence. */
  readonly durable?: boolean;
  /** Extra redis-server arguments for every node. */
  readonly args?: readonly string[];
  /** How long start-up (and each wait for a healthy cluster) may take; 30 s by default. */
  readonly timeoutMs?: number;
  /** TLS only, on the client ports, the cluster bus and replication (see above). */
  readonly tls?: RedisTlsFiles;
}

export interface ClusterNode {
  readonly port: number;
  readonly url: string;
  /** The pid of this node's current process (it changes after restartNode). */
  readonly pid: number;
  readonly alive: boolean;
  /** The role the cluster last agreed on (from CLUSTER NODES of a live node). */
  readonly role: 'master' | 'replica';
  readonly id: string;
  /** For a replica, the port of its master; null for a master. */
  readonly masterPort: number | null;
  readonly slots: readonly string[];
}

export interface Failover {
  readonly killed: ClusterNode;
  /** The killed master's replica, now a master serving its slots. */
  readonly promoted: ClusterNode;
}

export interface RedisCluster {
  /** The temporary directory holding every node's files (removed by stop()). */
  readonly dir: string;
  /** `redis://127.0.0.1:PORT` (`rediss://` with TLS) of every node started, masters first as created. */
  readonly seedUrls: readonly string[];
  /** The same as `{ host, port }`, for `new Cluster(seeds)`. */
  readonly seeds: ReadonlyArray<{ host: string; port: number }>;
  /** The current topology: every node started, with its pid, liveness and role. */
  nodes(): Promise<ClusterNode[]>;
  masters(): Promise<ClusterNode[]>;
  replicas(): Promise<ClusterNode[]>;
  /** SIGKILLs one node (any role). */
  killNode(port: number): Promise<void>;
  /** SIGKILLs a master (the given port, or the first live master) and waits until its replica serves its slots. */
  failover(masterPort?: number): Promise<Failover>;
  /** Waits until the replica of a killed master is a master and every live node reports cluster_state:ok. */
  waitForPromotion(killed: ClusterNode): Promise<ClusterNode>;
  /** Starts a killed node again, same port and node file: it rejoins (a former master as a replica). */
  restartNode(port: number): Promise<void>;
  /** Waits until every live node reports cluster_state:ok with all slots served and no live node is marked failed. */
  waitForHealthy(): Promise<void>;
  /**
   * Moves one slot, keys and all, from its master to the master on `toPort`
   * while clients go on (a live reshard, as `redis-cli --cluster reshard`
   * does it): IMPORTING on the target, MIGRATING on the source, the keys
   * MIGRATEd `keysPerStep` at a time with `pauseMs` between steps (so that
   * commands meet the slot mid-move), then NODE on every master. Resolves to
   * the keys moved.
   */
  migrateSlot(slot: number, toPort: number, pacing?: { keysPerStep?: number; pauseMs?: number }): Promise<number>;
  /** Kills every process the launcher started and removes its directory. Idempotent. */
  stop(): Promise<void>;
}

interface NodeSlot {
  readonly port: number;
  readonly busPort: number;
  readonly dir: string;
  process: RedisProcess;
}

export async function startRedisCluster(options: RedisClusterOptions = {}): Promise<RedisCluster> {
  // A port can be taken between freePort() and redis-server's bind: retry with new ports.
  let lastError: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      return await startOnce(options);
    } catch (error) {
      lastError = error;
      if (!String(error instanceof Error ? error.message : error).includes('Address already in use')) throw error;
    }
  }
  throw lastError;
}

async function startOnce(options: RedisClusterOptions): Promise<RedisCluster> {
  const masterCount = options.masters ?? 3;
  const replicasPerMaster = options.replicasPerMaster ?? 1;
  const timeoutMs = options.timeoutMs ?? 30_000;
  const tls = options.tls;
  const total = masterCount * (1 + replicasPerMaster);
  const root = await mkdtemp(join(tmpdir(), 'tally-cluster-'));
  // Data and bus ports both picked explicitly: the default bus port (port + 10000) can exceed 65535.
  const ports = await freePorts(total * 2);
  const slots: NodeSlot[] = [];
  const persistence = options.durable ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no'];
  const argsOf = (slot: Omit<NodeSlot, 'process'>): string[] => [
    '--cluster-enabled',
    'yes',
    '--cluster-config-file',
    join(slot.dir, 'nodes.conf'),
    '--cluster-port',
    String(slot.busPort),
    '--cluster-node-timeout',
    String(options.nodeTimeoutMs ?? 1_000),
    '--cluster-replica-validity-factor',
    '0',
    '--save',
    '',
    ...persistence,
    '--dir',
    slot.dir,
    '--loglevel',
    'warning',
    ...(tls ? ['--tls-cluster', 'yes', '--tls-replication', 'yes'] : []),
    ...(options.args ?? []),
  ];
  const launch = (slot: Omit<NodeSlot, 'process'>): Promise<RedisProcess> =>
    spawnRedis({ port: slot.port, args: argsOf(slot), readyTimeoutMs: timeoutMs, ...(tls ? { tls } : {}) });
  const scheme = tls ? 'rediss' : 'redis';
  const ask = (port: number, command: [string, ...string[]]): Promise<string> => askNode(port, command, tls);
  const onExit = (): void => killAllSync(slots.map((s) => s.process));
  process.once('exit', onExit);
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    await Promise.all(slots.map((s) => s.process.kill()));
    process.removeListener('exit', onExit);
    await rm(root, { recursive: true, force: true });
  };

  try {
    await Promise.all(
      Array.from({ length: total }, async (_, i) => {
        const shape = { port: ports[i]!, busPort: ports[total + i]!, dir: join(root, String(ports[i])) };
        await mkdir(shape.dir);
        slots[i] = { ...shape, process: await launch(shape) };
      }),
    );
    await run(
      'redis-cli',
      [
        ...(tls ? ['--tls', '--cacert', tls.caFile] : []),
        '--cluster',
        'create',
        ...slots.map((s) => `127.0.0.1:${s.port}`),
        '--cluster-replicas',
        String(replicasPerMaster),
        '--cluster-yes',
      ],
      { timeout: timeoutMs },
    );
  } catch (error) {
    // slots may be partly filled when a spawn failed: kill what did start.
    await Promise.all(slots.filter(Boolean).map((s) => s.process.kill()));
    process.removeListener('exit', onExit);
    await rm(root, { recursive: true, force: true });
    throw error;
  }

  const slotOf = (port: number): NodeSlot => {
    const slot = slots.find((s) => s.port === port);
    if (!slot) throw new Error(`no cluster node on port ${port}`);
    return slot;
  };

  const nodes = async (): Promise<ClusterNode[]> => {
    const view = await topologyFromAnyLiveNode(slots, tls);
    const portOfId = new Map(view.map((line) => [line.id, line.port]));
    return slots.map((slot) => {
      const line = view.find((l) => l.port === slot.port);
      return {
        port: slot.port,
        url: `${scheme}://127.0.0.1:${slot.port}`,
        pid: slot.process.pid,
        alive: slot.process.alive(),
        role: line?.role ?? 'replica',
        id: line?.id ?? '',
        masterPort: line?.masterId ? (portOfId.get(line.masterId) ?? null) : null,
        slots: line?.slots ?? [],
      };
    });
  };

  const waitForHealthy = async (): Promise<void> => {
    await waitUntil(timeoutMs, 'the cluster to report cluster_state:ok on every live node', async () => {
      for (const slot of slots.filter((s) => s.process.alive())) {
        const info = parseInfo(await ask(slot.port, ['CLUSTER', 'INFO']));
        if (info.get('cluster_state') !== 'ok' || info.get('cluster_slots_ok') !== String(CLUSTER_SLOTS)) return false;
        const view = parseClusterNodes(await ask(slot.port, ['CLUSTER', 'NODES']));
        const live = new Set(slots.filter((s) => s.process.alive()).map((s) => s.port));
        if (view.some((line) => live.has(line.port) && line.failed)) return false;
        if (view.filter((line) => line.role === 'master' && line.slots.length > 0 && !line.failed).length !== masterCount) return false;
        const self = view.find((line) => line.myself);
        if (self?.role === 'replica' && parseInfo(await ask(slot.port, ['INFO', 'replication'])).get('master_link_status') !== 'up') return false;
      }
      return true;
    });
  };

  const waitForPromotion = async (killed: ClusterNode): Promise<ClusterNode> => {
    let promoted: ClusterNode | undefined;
    await waitUntil(timeoutMs, `a replica of the master on port ${killed.port} to take over`, async () => {
      const current = await nodes();
      promoted = current.find((n) => n.alive && n.role === 'master' && killed.slots.length > 0 && n.slots.join() === killed.slots.join());
      return promoted !== undefined;
    });
    await waitUntil(timeoutMs, 'every live node to report cluster_state:ok after the failover', async () => {
      for (const slot of slots.filter((s) => s.process.alive())) {
        if (parseInfo(await ask(slot.port, ['CLUSTER', 'INFO'])).get('cluster_state') !== 'ok') return false;
      }
      return true;
    });
    return promoted!;
  };

  const handle: RedisCluster = {
    dir: root,
    seedUrls: slots.map((s) => `${scheme}://127.0.0.1:${s.port}`),
    seeds: slots.map((s) => ({ host: '127.0.0.1', port: s.port })),
    nodes,
    masters: async () => (await nodes()).filter((n) => n.alive && n.role === 'master'),
    replicas: async () => (await nodes()).filter((n) => n.alive && n.role === 'replica'),
    async killNode(port) {
      await slotOf(port).process.kill();
    },
    async failover(masterPort) {
      const before = await nodes();
      const killed = before.find((n) => n.alive && n.role === 'master' && (masterPort === undefined || n.port === masterPort));
      if (!killed) throw new Error(masterPort === undefined ? 'no live master to kill' : `port ${masterPort} is not a live master`);
      if (!before.some((n) => n.alive && n.masterPort === killed.port)) throw new Error(`master on port ${killed.port} has no live replica to promote`);
      await slotOf(killed.port).process.kill();
      const promoted = await waitForPromotion({ ...killed, alive: false });
      return { killed: { ...killed, alive: false }, promoted };
    },
    waitForPromotion,
    async restartNode(port) {
      const slot = slotOf(port);
      if (slot.process.alive()) throw new Error(`node on port ${port} is still running`);
      slot.process = await launch(slot);
    },
    waitForHealthy,
    async migrateSlot(slot, toPort, pacing = {}) {
      const current = await nodes();
      const masters = current.filter((n) => n.alive && n.role === 'master');
      const source = masters.find((n) => n.slots.some((range) => slotInRange(slot, range)));
      const target = masters.find((n) => n.port === toPort);
      if (!source) throw new Error(`no live master serves slot ${slot}`);
      if (!target) throw new Error(`port ${toPort} is not a live master`);
      if (source.port === target.port) return 0;
      await ask(target.port, ['CLUSTER', 'SETSLOT', String(slot), 'IMPORTING', source.id]);
      await ask(source.port, ['CLUSTER', 'SETSLOT', String(slot), 'MIGRATING', target.id]);
      const keysPerStep = pacing.keysPerStep ?? 100;
      const admin = new Redis({ ...adminClientOptions(source.port, tls ? { tls } : {}), connectTimeout: 1_000 });
      admin.on('error', () => {});
      let moved = 0;
      try {
        for (;;) {
          const keys = (await admin.call('CLUSTER', 'GETKEYSINSLOT', String(slot), String(keysPerStep))) as string[];
          if (keys.length === 0) break;
          await admin.call('MIGRATE', '127.0.0.1', String(target.port), '', '0', '5000', 'KEYS', ...keys);
          moved += keys.length;
          if (pacing.pauseMs) await sleep(pacing.pauseMs);
        }
      } finally {
        admin.disconnect();
      }
      for (const master of [target, source, ...masters.filter((n) => n.port !== target.port && n.port !== source.port)]) {
        await ask(master.port, ['CLUSTER', 'SETSLOT', String(slot), 'NODE', target.id]);
      }
      return moved;
    },
    stop,
  };
  try {
    await waitForHealthy();
  } catch (error) {
    await stop();
    throw error;
  }
  return handle;
}

/** Whether `slot` is in a CLUSTER NODES slot entry (`5461` or `0-5460`; a `[…]` migration entry holds none). */
function slotInRange(slot: number, range: string): boolean {
  if (range.startsWith('[')) return false;
  const [from, to = from] = range.split('-').map(Number);
  return slot >= from! && slot <= to!;
}

/** One command on one node over a short-lived connection (CLUSTER INFO, CLUSTER NODES, INFO). */
async function askNode(port: number, command: [string, ...string[]], tls: RedisTlsFiles | undefined): Promise<string> {
  const redis = new Redis({ ...adminClientOptions(port, tls ? { tls } : {}), connectTimeout: 1_000 });
  redis.on('error', () => {});
  try {
    await redis.connect();
    return String(await redis.call(...command));
  } finally {
    redis.disconnect();
  }
}

async function topologyFromAnyLiveNode(slots: readonly NodeSlot[], tls: RedisTlsFiles | undefined): Promise<ClusterNodeLine[]> {
  let lastError: unknown = new Error('no live cluster node');
  for (const slot of slots) {
    if (!slot.process.alive()) continue;
    try {
      return parseClusterNodes(await askNode(slot.port, ['CLUSTER', 'NODES'], tls));
    } catch (error) {
      lastError = error;
    }
  }
  throw lastError;
}

async function waitUntil(timeoutMs: number, what: string, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown = null;
  for (;;) {
    try {
      if (await check()) return;
    } catch (error) {
      lastError = error; // a node still starting or just killed: ask again
    }
    if (Date.now() > deadline) {
      const cause = lastError instanceof Error ? ` (last error: ${lastError.message})` : '';
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${cause}`);
    }
    await sleep(100);
  }
}
