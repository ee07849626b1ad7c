/**
 * A redis-server of the caller's own, on a free loopback port. The machine's
 * Redis is shared with other suites and must never be stopped, flushed or
 * reconfigured; a test that kills Redis, changes its settings, or needs exact
 * command counters (the bench) starts one of these and stops it after.
 *
 * With `durable`, every write is in the append-only file before Redis replies
 * (appendfsync always), so a SIGKILL loses nothing that was acknowledged and
 * the restart reloads it; the script cache, as on any restart, is empty.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { freePort } from './free-port.js';
import { parseInfo } from '@tally/shared';
import { killAllSync, spawnRedis, type RedisProcess } from './redis-process.js';

export interface PrivateRedisOptions {
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
  const launch = (): Promise<RedisProcess> => spawnRedis({ port, args, ...(options.binary ? { binary: options.binary } : {}) });
  let server: RedisProcess;
  try {
    server = await launch();
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
  const onExit = (): void => killAllSync([server]);
  process.once('exit', onExit);
  const url = `redis://127.0.0.1:${port}`;
  const version = await serverVersion(url);
  let stopped = false;
  return {
    url,
    port,
    get pid() {
      return server.pid;
    },
    version,
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

async function serverVersion(url: string): Promise<string> {
  const redis = new Redis(url, { maxRetriesPerRequest: 1 });
  try {
    return parseInfo(await redis.info('server')).get('redis_version') ?? 'unknown';
  } finally {
    redis.disconnect();
  }
}
