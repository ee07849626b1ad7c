/**
 * A private redis-server for the bench, on a free loopback port, without
 * persistence. Why: the machine's Redis is shared with other engineers'
 * test suites, so its command counters and memory move under us; a private
 * server makes "Redis commands per message" and "bytes per marker" exact,
 * and keeps the bench from slowing anyone else down.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { parseInfo } from './redis-info.js';

export interface PrivateRedis {
  readonly url: string;
  readonly pid: number;
  readonly version: string;
  stop(): Promise<void>;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

export async function startPrivateRedis(binary = 'redis-server'): Promise<PrivateRedis> {
  const port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'tally-bench-redis-'));
  const child: ChildProcess = spawn(
    binary,
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, '--daemonize', 'no', '--loglevel', 'warning'],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  const failed = new Promise<never>((_, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`redis-server exited with code ${code}`)));
  });
  failed.catch(() => {});
  const url = `redis://127.0.0.1:${port}`;
  const deadline = Date.now() + 10_000;
  let version = 'unknown';
  for (;;) {
    const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {});
    try {
      await Promise.race([probe.connect(), failed]);
      version = parseInfo(await probe.info('server')).get('redis_version') ?? version;
      probe.disconnect();
      break;
    } catch (error) {
      probe.disconnect();
      if (Date.now() > deadline || child.exitCode !== null) {
        child.kill('SIGKILL');
        throw new Error(`private redis-server did not start: ${error instanceof Error ? error.message : String(error)}`);
      }
      await sleep(50);
    }
  }
  let stopped = false;
  return {
    url,
    pid: child.pid!,
    version,
    async stop() {
      if (stopped) return;
      stopped = true;
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGTERM');
        await Promise.race([exited, sleep(5_000)]);
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      }
      await rm(dir, { recursive: true, force: true }).catch(() => {});
    },
  };
}
