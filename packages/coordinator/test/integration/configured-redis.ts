/**
 * A redis-server of the test's own, started with whatever settings a test
 * needs (an eviction policy, a password, ACL users, TLS, cluster mode, a
 * replica), on free loopback ports, torn down by the test. The machine's
 * shared Redis is never reconfigured.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis, type RedisOptions } from 'ioredis';
import { freePort } from '@tally/testkit';

export interface ConfiguredRedis {
  readonly port: number;
  readonly dir: string;
  /** A client for the test's own set-up (ACL SETUSER, INFO), as the server's admin. */
  admin(): Redis;
  /** Sends a signal to the server process (SIGSTOP: a Redis that answers nothing; SIGCONT: back). */
  signal(signal: NodeJS.Signals): void;
  stop(): Promise<void>;
}

export interface RedisSettings {
  /** Extra redis-server arguments. */
  readonly args?: readonly string[];
  /** The default user's password (--requirepass). */
  readonly password?: string;
  /** Listen for TLS only (no plaintext port at all); the admin client then speaks TLS. */
  readonly tls?: { readonly certFile: string; readonly keyFile: string; readonly caFile: string; readonly ca: Buffer };
}

export async function startConfiguredRedis(settings: RedisSettings = {}): Promise<ConfiguredRedis> {
  const port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'tally-test-redis-'));
  const portArgs = settings.tls
    ? ['--port', '0', '--tls-port', String(port), '--tls-cert-file', settings.tls.certFile, '--tls-key-file', settings.tls.keyFile, '--tls-ca-cert-file', settings.tls.caFile, '--tls-auth-clients', 'no']
    : ['--port', String(port)];
  const args = [
    ...portArgs,
    '--bind', '127.0.0.1',
    '--save', '',
    '--appendonly', 'no',
    '--dir', dir,
    '--daemonize', 'no',
    '--loglevel', 'warning',
    ...(settings.password ? ['--requirepass', settings.password] : []),
    ...(settings.args ?? []),
  ];
  const child: ChildProcess = spawn('redis-server', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
  const options: RedisOptions = {
    host: '127.0.0.1',
    port,
    password: settings.password,
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    ...(settings.tls ? { tls: { ca: settings.tls.ca } } : {}),
  };
  const admin = (): Redis => {
    const client = new Redis(options);
    client.on('error', () => {});
    return client;
  };
  const signal = (name: NodeJS.Signals): void => {
    if (child.exitCode === null && child.signalCode === null) child.kill(name);
  };
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      await exited;
    }
    await rm(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 15_000;
  for (;;) {
    if (child.exitCode !== null) {
      await stop();
      throw new Error(`redis-server ${args.join(' ')} exited: ${stderr}`);
    }
    const probe = admin();
    try {
      await probe.connect();
      if ((await probe.ping()) === 'PONG') break;
    } catch (error) {
      if (Date.now() > deadline) {
        await stop();
        throw new Error(`private redis on ${port} did not answer: ${String(error)} ${stderr}`);
      }
    } finally {
      probe.disconnect();
    }
    await sleep(50);
  }
  return { port, dir, admin, signal, stop };
}

/** Runs `work` with an admin client of `server`, then disconnects it. */
export async function asAdmin<T>(server: ConfiguredRedis, work: (redis: Redis) => Promise<T>): Promise<T> {
  const redis = server.admin();
  try {
    await redis.connect();
    return await work(redis);
  } finally {
    redis.disconnect();
  }
}
