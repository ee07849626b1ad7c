/**
 * One redis-server child process: spawned from the installed binary, ready
 * once it answers PING, killed by its own pid. The private server and the
 * cluster launcher are both built from it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';

export interface RedisProcess {
  readonly port: number;
  readonly pid: number;
  readonly child: ChildProcess;
  /** True until the process has exited (for any reason). */
  alive(): boolean;
  /** SIGKILL and wait for the exit; a no-op when it has already exited. */
  kill(): Promise<void>;
  /** SIGTERM (so the server can finish writing its files), SIGKILL after `graceMs`. */
  terminate(graceMs?: number): Promise<void>;
}

export interface SpawnRedisOptions {
  readonly binary?: string;
  readonly port: number;
  /** Arguments after `--port N --bind 127.0.0.1`. */
  readonly args: readonly string[];
  readonly readyTimeoutMs?: number;
}

/** Spawns redis-server and resolves once it answers PING; rejects (with the server's stderr) if it exits first. */
export async function spawnRedis(options: SpawnRedisOptions): Promise<RedisProcess> {
  const child = spawn(options.binary ?? 'redis-server', ['--port', String(options.port), '--bind', '127.0.0.1', '--daemonize', 'no', ...options.args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
    stderr = (stderr + chunk).slice(-2000);
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const spawnError = new Promise<Error>((resolve) => child.once('error', resolve));
  const alive = (): boolean => child.exitCode === null && child.signalCode === null;
  const handle: RedisProcess = {
    port: options.port,
    pid: child.pid ?? -1,
    child,
    alive,
    async kill() {
      if (!alive()) return;
      child.kill('SIGKILL');
      await exited;
    },
    async terminate(graceMs = 5_000) {
      if (!alive()) return;
      child.kill('SIGTERM');
      await Promise.race([exited, sleep(graceMs)]);
      await handle.kill();
    },
  };
  const url = `redis://127.0.0.1:${options.port}`;
  const deadline = Date.now() + (options.readyTimeoutMs ?? 15_000);
  for (;;) {
    const failure = await Promise.race([spawnError, sleep(0).then(() => null)]);
    if (failure) throw new Error(`cannot start ${options.binary ?? 'redis-server'}: ${failure.message}`);
    if (!alive()) throw new Error(`redis-server on port ${options.port} exited with code ${child.exitCode}: ${stderr.trim()}`);
    if (await answersPing(url)) return handle;
    if (Date.now() > deadline) {
      await handle.kill();
      throw new Error(`redis-server on port ${options.port} did not answer PING in time: ${stderr.trim()}`);
    }
    await sleep(50);
  }
}

async function answersPing(url: string): Promise<boolean> {
  const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: 1_000 });
  probe.on('error', () => {});
  try {
    await probe.connect();
    return (await probe.ping()) === 'PONG';
  } catch {
    return false; // not listening yet, or still loading its append-only file
  } finally {
    probe.disconnect();
  }
}

/** Kills, synchronously, every process still alive: for `process.on('exit')`, so a crashed test run leaves no server behind. */
export function killAllSync(processes: Iterable<RedisProcess>): void {
  for (const p of processes) {
    if (p.alive()) {
      try {
        p.child.kill('SIGKILL');
      } catch {
        // already gone
      }
    }
  }
}
