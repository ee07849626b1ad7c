/**
 * A redis-server of the test's own, on a free loopback port, so a test can
 * kill and restart Redis without touching the machine's shared one. With
 * `durable`, every write is in the append-only file before Redis replies
 * (appendfsync always), so a SIGKILL loses nothing that was acknowledged and
 * the restart reloads it; the script cache, as on any restart, is empty.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { freePort } from '@tally/bench';

export interface PrivateRedis {
  readonly url: string;
  readonly port: number;
  /** SIGKILL, then start again on the same port and data directory; resolves once it answers PING. */
  crashAndRestart(downMs?: number): Promise<void>;
  stop(): Promise<void>;
}


async function waitForPing(url: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {});
    try {
      await probe.connect();
      if ((await probe.ping()) === 'PONG') return;
    } catch {
      // not up yet (or still loading its append-only file)
    } finally {
      probe.disconnect();
    }
    await sleep(50);
  }
  throw new Error(`private redis at ${url} did not answer within ${timeoutMs} ms`);
}

export async function startPrivateRedis(options: { durable?: boolean } = {}): Promise<PrivateRedis> {
  const port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'tally-test-redis-'));
  const persistence = options.durable ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no'];
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', ...persistence, '--dir', dir, '--daemonize', 'no', '--loglevel', 'warning'];
  const url = `redis://127.0.0.1:${port}`;
  let child: ChildProcess;
  const launch = async (): Promise<void> => {
    child = spawn('redis-server', args, { stdio: ['ignore', 'ignore', 'ignore'] });
    await waitForPing(url);
  };
  const kill = async (): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
  };
  await launch();
  return {
    url,
    port,
    async crashAndRestart(downMs = 500) {
      await kill();
      await sleep(downMs);
      await launch();
    },
    async stop() {
      await kill();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
