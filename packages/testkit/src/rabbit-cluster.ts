/**
 * RabbitMQ nodes of the test's own: a cluster of N nodes (3 by default), or
 * one node with only a TLS listener, from the installed rabbitmq-server
 * package, on free loopback ports, beside the machine's default node.
 *
 * The package's own scripts are run directly (`dpkg -L rabbitmq-server`):
 * the `rabbitmq-server` on the PATH is a wrapper that switches user with
 * `su` and drops the RABBITMQ_* variables. Each node gets its own node name,
 * AMQP port, distribution port, data and log directories and config files,
 * so nothing of the default node (rabbit@localhost on 5672 and 25672) is
 * shared but epmd, where each node registers under its own name.
 *
 * The Erlang cookie: the cluster's nodes and the rabbitmqctl calls made here
 * run with HOME set to the cluster's temporary directory, which holds a
 * fresh `.erlang.cookie`; the default node's cookie
 * (/var/lib/rabbitmq/.erlang.cookie) and root's HOME are never touched, so
 * the default node and its CLI tools go on working.
 *
 * Ports 35672-35682 are avoided: every rabbitmqctl on the machine binds one
 * of them for its own distribution (RABBITMQ_CTL_DIST_PORT_MIN), and a node
 * listening there fails its start at random with eaddrinuse.
 *
 * A cluster is formed at boot by classic-config peer discovery, every node
 * started at once: the first boots alone, each other one lists it and joins
 * it as soon as it is up. About 15 s on 2 busy cores (each VM needs 3 to 8 s
 * of its own before it gets that far).
 */
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { randomBytes } from 'node:crypto';
import { freePort } from './free-port.js';

const run = promisify(execFile);

/** The certificate files a TLS listener presents (PEM). */
export interface RabbitTlsFiles {
  readonly certFile: string;
  readonly keyFile: string;
  /** The CA the node trusts for client certificates (none are asked for); RabbitMQ requires the setting. */
  readonly caFile: string;
}

export interface RabbitClusterOptions {
  /** Nodes (3 by default; 1 for a single node, not clustered). */
  readonly nodes?: number;
  /** Only a TLS listener on each node (listeners.tcp = none), with these files. */
  readonly tls?: RabbitTlsFiles;
  /** How long the start may take; 90 s by default. */
  readonly timeoutMs?: number;
}

export interface RabbitNode {
  /** The Erlang node name, `tally-<id>-<n>@localhost`. */
  readonly name: string;
  /** The AMQP port (TLS when the cluster was started with `tls`). */
  readonly port: number;
  /** `amqp://guest:guest@127.0.0.1:PORT` (amqps:// with `tls`). */
  readonly url: string;
  /** The pid of the node's Erlang VM (beam.smp). */
  readonly pid: number;
  readonly alive: boolean;
}

export interface RabbitCluster {
  /** The temporary directory of every node's files (removed by stop()). */
  readonly dir: string;
  readonly nodes: readonly RabbitNode[];
  /** Every node's URL, in node order. */
  readonly urls: readonly string[];
  node(name: string): RabbitNode;
  /** The node listening on an AMQP port. */
  nodeAtPort(port: number): RabbitNode;
  /** SIGKILLs a node's Erlang VM and waits until it is gone; it is never restarted. */
  kill(name: string): Promise<void>;
  /** Runs rabbitmqctl against a node (a live one by default): its stdout. */
  ctl(args: readonly string[], name?: string): Promise<string>;
  /** The node name of a quorum queue's leader, as a live node reports it; null while it has none. */
  queueLeader(queue: string, vhost?: string): Promise<string | null>;
  /** Kills every process the launcher started and removes its directory. Idempotent. */
  stop(): Promise<void>;
}

/** The package's own scripts, not the wrappers on the PATH. */
function packageScripts(): { server: string; ctl: string } {
  const files = execFileSync('dpkg', ['-L', 'rabbitmq-server'], { encoding: 'utf8' }).split('\n');
  const server = files.find((f) => f.endsWith('/rabbitmq/bin/rabbitmq-server'));
  if (server === undefined) throw new Error('rabbitmq-server is not installed as a package (dpkg -L rabbitmq-server lists no /rabbitmq/bin/rabbitmq-server)');
  return { server, ctl: server.replace(/rabbitmq-server$/, 'rabbitmqctl') };
}

const CLI_DIST_PORTS: readonly [number, number] = [35672, 35682];

/** A free loopback port outside the CLI tools' distribution range. */
async function nodePort(taken: Set<number>): Promise<number> {
  for (;;) {
    const port = await freePort();
    if (port >= CLI_DIST_PORTS[0] && port <= CLI_DIST_PORTS[1]) continue;
    if (taken.has(port)) continue;
    taken.add(port);
    return port;
  }
}

function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port });
    const done = (open: boolean): void => {
      socket.destroy();
      resolve(open);
    };
    socket.setTimeout(1_000, () => done(false));
    socket.once('error', () => done(false));
    socket.once('connect', () => done(true));
  });
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

interface NodeSlot {
  readonly name: string;
  readonly port: number;
  readonly distPort: number;
  readonly dir: string;
  readonly url: string;
  child: ChildProcess | null;
  pid: number;
  killed: boolean;
}

/** Every launcher's children, killed synchronously if the test process exits with them still running. */
const liveGroups = new Set<number>();
process.once('exit', () => {
  for (const pgid of liveGroups) {
    try {
      process.kill(-pgid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
});

export async function startRabbitCluster(options: RabbitClusterOptions = {}): Promise<RabbitCluster> {
  // A port can be taken between freePort() and the node's bind: start again on new ports, a few times.
  let lastError: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      return await startOnce(options);
    } catch (error) {
      lastError = error;
      if (!/eaddrinuse/i.test(error instanceof Error ? error.message : String(error))) throw error;
    }
  }
  throw lastError;
}

async function startOnce(options: RabbitClusterOptions): Promise<RabbitCluster> {
  const count = options.nodes ?? 3;
  const timeoutMs = options.timeoutMs ?? 90_000;
  const scripts = packageScripts();
  const dir = await mkdtemp(join(tmpdir(), 'tally-rabbit-'));
  const id = randomBytes(3).toString('hex');
  // HOME of every node and CLI call here: the cookie of this cluster only.
  await writeFile(join(dir, '.erlang.cookie'), randomBytes(20).toString('hex').toUpperCase(), { mode: 0o400 });
  const taken = new Set<number>();
  const slots: NodeSlot[] = [];
  for (let i = 1; i <= count; i++) {
    const port = await nodePort(taken);
    const distPort = await nodePort(taken);
    const scheme = options.tls ? 'amqps' : 'amqp';
    slots.push({
      name: `tally-${id}-${i}@localhost`,
      port,
      distPort,
      dir: join(dir, `node${i}`),
      url: `${scheme}://guest:guest@127.0.0.1:${port}`,
      child: null,
      pid: -1,
      killed: false,
    });
  }
  const baseEnv: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('RABBITMQ_') && key !== 'ERL_FLAGS'));
  const envOf = (slot: NodeSlot): NodeJS.ProcessEnv => ({
    ...baseEnv,
    HOME: dir,
    RABBITMQ_NODENAME: slot.name,
    RABBITMQ_DIST_PORT: String(slot.distPort),
    RABBITMQ_MNESIA_BASE: join(slot.dir, 'mnesia'),
    RABBITMQ_LOG_BASE: join(slot.dir, 'log'),
    RABBITMQ_PID_FILE: join(slot.dir, 'beam.pid'),
    RABBITMQ_CONF_ENV_FILE: join(slot.dir, 'rabbitmq-env.conf'),
    RABBITMQ_CONFIG_FILE: join(slot.dir, 'rabbitmq.conf'),
    RABBITMQ_ENABLED_PLUGINS_FILE: join(slot.dir, 'enabled_plugins'),
    RABBITMQ_PLUGINS_EXPAND_DIR: join(slot.dir, 'plugins-expand'),
    // Distribution on loopback only, as the default node has it.
    ERL_FLAGS: '-kernel inet_dist_use_interface {127,0,0,1}',
  });
  const ctlEnv = (slot: NodeSlot): NodeJS.ProcessEnv => ({ ...baseEnv, HOME: dir, RABBITMQ_CONF_ENV_FILE: join(slot.dir, 'rabbitmq-env.conf') });

  for (const slot of slots) {
    await mkdir(slot.dir, { recursive: true });
    await writeFile(join(slot.dir, 'rabbitmq-env.conf'), 'ERL_EPMD_ADDRESS=127.0.0.1\n');
    await writeFile(join(slot.dir, 'enabled_plugins'), '[].\n');
    const lines = options.tls
      ? [
          'listeners.tcp = none',
          `listeners.ssl.default = 127.0.0.1:${slot.port}`,
          `ssl_options.cacertfile = ${options.tls.caFile}`,
          `ssl_options.certfile = ${options.tls.certFile}`,
          `ssl_options.keyfile = ${options.tls.keyFile}`,
          'ssl_options.verify = verify_none',
          'ssl_options.fail_if_no_peer_cert = false',
        ]
      : [`listeners.tcp.default = 127.0.0.1:${slot.port}`];
    if (count > 1 && slot !== slots[0]) {
      // The first node boots alone; every other one joins it as soon as it is up (retrying every 500 ms meanwhile).
      lines.push(
        'cluster_formation.peer_discovery_backend = classic_config',
        `cluster_formation.classic_config.nodes.1 = ${slots[0]!.name}`,
        `cluster_formation.classic_config.nodes.2 = ${slot.name}`,
        'cluster_formation.randomized_startup_delay_range.min = 0',
        'cluster_formation.randomized_startup_delay_range.max = 0',
        'cluster_formation.discovery_retry_limit = 240',
        'cluster_formation.discovery_retry_interval = 500',
      );
    }
    await writeFile(join(slot.dir, 'rabbitmq.conf'), `${lines.join('\n')}\n`);
  }

  const stopped = { done: false };
  const killSlot = async (slot: NodeSlot): Promise<void> => {
    const child = slot.child;
    if (child === null) return;
    const exited =
      child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise<void>((resolve) => child.once('exit', () => resolve()));
    // The script's process group: the shell, the Erlang VM and its helpers (erl_child_setup, inet_gethost, the disk monitor).
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      // already gone
    }
    await exited;
    liveGroups.delete(child.pid!);
  };
  const stop = async (): Promise<void> => {
    if (stopped.done) return;
    stopped.done = true;
    for (const slot of slots) await killSlot(slot);
    await rm(dir, { recursive: true, force: true });
  };

  try {
    for (const slot of slots) {
      const out = openSync(join(slot.dir, 'console.log'), 'a');
      try {
        // Its own process group, so stop() reaches every process the script starts.
        slot.child = spawn(scripts.server, [], { env: envOf(slot), stdio: ['ignore', out, out], detached: true });
      } finally {
        closeSync(out);
      }
      liveGroups.add(slot.child.pid!);
    }
    const deadline = Date.now() + timeoutMs;
    for (const slot of slots) {
      for (;;) {
        const child = slot.child!;
        if (child.exitCode !== null || child.signalCode !== null) {
          const console = await readFile(join(slot.dir, 'console.log'), 'utf8').catch(() => '');
          throw new Error(`RabbitMQ node ${slot.name} exited during its start (code ${child.exitCode}): ${console.slice(-1500)}`);
        }
        if (await portOpen(slot.port)) break;
        if (Date.now() > deadline) throw new Error(`RabbitMQ node ${slot.name} did not listen on ${slot.port} within ${timeoutMs} ms`);
        await sleep(200);
      }
      slot.pid = Number((await readFile(join(slot.dir, 'beam.pid'), 'utf8')).trim());
    }
    if (count > 1) {
      // Listening means booted; booted with every peer in one cluster is what the tests need.
      const status = JSON.parse(
        (await run(scripts.ctl, ['-q', '-n', slots[0]!.name, 'cluster_status', '--formatter', 'json'], { env: ctlEnv(slots[0]!), timeout: 60_000 })).stdout,
      ) as { running_nodes?: string[] };
      const running = new Set(status.running_nodes ?? []);
      const missing = slots.filter((slot) => !running.has(slot.name)).map((slot) => slot.name);
      if (missing.length > 0) throw new Error(`RabbitMQ cluster formed without ${missing.join(', ')}: running ${[...running].join(', ')}`);
    }
  } catch (error) {
    await stop();
    throw error;
  }

  const view = (slot: NodeSlot): RabbitNode => ({
    name: slot.name,
    port: slot.port,
    url: slot.url,
    pid: slot.pid,
    alive: !slot.killed && pidAlive(slot.pid),
  });
  const slotNamed = (name: string): NodeSlot => {
    const slot = slots.find((s) => s.name === name);
    if (slot === undefined) throw new Error(`no node ${name} in this cluster`);
    return slot;
  };
  const ctl = async (args: readonly string[], name?: string): Promise<string> => {
    const slot = name === undefined ? slots.find((s) => !s.killed) : slotNamed(name);
    if (slot === undefined) throw new Error('no live node to ask');
    return (await run(scripts.ctl, ['-q', '-n', slot.name, ...args], { env: ctlEnv(slot), timeout: 60_000 })).stdout;
  };

  return {
    dir,
    get nodes() {
      return slots.map(view);
    },
    urls: slots.map((slot) => slot.url),
    node: (name) => view(slotNamed(name)),
    nodeAtPort(port) {
      const slot = slots.find((s) => s.port === port);
      if (slot === undefined) throw new Error(`no node of this cluster listens on ${port}`);
      return view(slot);
    },
    async kill(name) {
      const slot = slotNamed(name);
      slot.killed = true;
      try {
        process.kill(slot.pid, 'SIGKILL');
      } catch {
        // already gone
      }
      while (pidAlive(slot.pid)) await sleep(20);
      // What is left of its process group (the script's shell, helpers) goes too.
      await killSlot(slot);
    },
    ctl,
    async queueLeader(queue, vhost = '/') {
      const out = await ctl(['list_queues', '-p', vhost, '--formatter', 'json', 'name', 'leader']);
      const rows = JSON.parse(out) as Array<{ name: string; leader?: string }>;
      const leader = rows.find((row) => row.name === queue)?.leader;
      return typeof leader === 'string' && leader !== '' ? leader : null;
    },
    stop,
  };
}
