/**
 * A redis-server of the caller's own, on a free loopback port. The machine's
 * Redis is shared with other suites and must never be stopped, flushed or
 * reconfigured; a test that kills Redis, changes its settings, or needs exact
 * command counters (the bench) starts one of these and stops it after.
 *
 * With `durable`, every write is in the append-only file before Redis replies
 * (appendfsync always), so a SIGKILL loses nothing that was acknowledged and
 * the restart reloads it; the script cache, as on any restart, is empty.
 *
 * A `password` and `tls` make it a server a test of authentication or TLS
 * needs; `admin()` is then the way in for the test's own set-up (ACL SETUSER,
 * INFO), and `signal('SIGSTOP')` makes a Redis that answers nothing.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { parseInfo } from '@tally/shared';
import { freePort } from './free-port.js';
import { adminClientOptions, killAllSync, spawnRedis, type RedisAccess, type RedisProcess } from './redis-process.js';

export interface PrivateRedisOptions extends RedisAccess {
  readonly durable?: boolean;
  /** Extra redis-server arguments, e.g. ['--maxmemory', '10mb']. */
  readonly args?: readonly string[];
  readonly binary?: string;
}

export interface PrivateRedis {
  readonly url: string;
  readonly port: number;
  /** The current server process (it changes after crashAndRestart). */
  readonly pid: number;
  readonly version: string;
  /** A new, not yet connected client as the server's admin (the default user, over TLS if the server speaks only that). */
  admin(): Redis;
  /** Sends a signal to the server process (SIGSTOP: a Redis that answers nothing; SIGCONT: back). */
  signal(signal: NodeJS.Signals): void;
  /** SIGKILL, then start again on the same port and data directory; resolves once it answers PING. */
  crashAndRestart(downMs?: number): Promise<void>;
  /** Kills the server and removes its data directory. */
  stop(): Promise<void>;
}

export async function startPrivateRedis(options: PrivateRedisOptions = {}): Promise<PrivateRedis> {
  const port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'tally-redis-'));
  const persistence = options.durable ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no'];
  const args = ['--save', '', ...persistence, '--dir', dir, '--loglevel', 'warning', ...(options.args ?? [])];
  const access: RedisAccess = { password: options.password, tls: options.tls };
  const launch = (): Promise<RedisProcess> => spawnRedis({ port, args, ...access, ...(options.binary ? { binary: options.binary } : {}) });
  let server: RedisProcess;
  try {
    server = await launch();
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
  const onExit = (): void => killAllSync([server]);
  process.once('exit', onExit);
  const admin = (): Redis => {
    const client = new Redis(adminClientOptions(port, access));
    client.on('error', () => {});
    return client;
  };
  const userInfo = options.password ? `:${encodeURIComponent(options.password)}@` : '';
  const url = `${options.tls ? 'rediss' : 'redis'}://${userInfo}127.0.0.1:${port}`;
  const version = await serverVersion(admin());
  let stopped = false;
  return {
    url,
    port,
    get pid() {
      return server.pid;
    },
    version,
    admin,
    signal(name) {
      if (server.alive()) server.child.kill(name);
    },
    async crashAndRestart(downMs = 500) {
      await server.kill();
      await sleep(downMs);
      server = await launch();
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      process.removeListener('exit', onExit);
      await server.kill();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

async function serverVersion(redis: Redis): Promise<string> {
  try {
    await redis.connect();
    return parseInfo(await redis.info('server')).get('redis_version') ?? 'unknown';
  } finally {
    redis.disconnect();
  }
}

/** Runs `work` with a connected admin client of `server`, then disconnects it. */
export async function asAdmin<T>(server: PrivateRedis, work: (redis: Redis) => Promise<T>): Promise<T> {
  const redis = server.admin();
  try {
    await redis.connect();
    return await work(redis);
  } finally {
    redis.disconnect();
  }
}
