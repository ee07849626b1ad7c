/**
 * One redis-server child process: spawned from the installed binary, ready
 * once it answers PING, killed by its own pid. The private server and the
 * cluster launcher are both built from it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis, type RedisOptions } from 'ioredis';

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

/** A server certificate for a TLS-only redis-server, and the CA a client verifies it with. */
export interface RedisTlsFiles {
  readonly certFile: string;
  readonly keyFile: string;
  readonly caFile: string;
  /** The CA certificate's contents, for the clients of the test itself. */
  readonly ca: Buffer;
}

/** How a client gets in: the default user's password (--requirepass), TLS. */
export interface RedisAccess {
  readonly password?: string;
  /** Listen for TLS only, with no plaintext port at all, so any success proves TLS was spoken. */
  readonly tls?: RedisTlsFiles;
}

export interface SpawnRedisOptions extends RedisAccess {
  readonly binary?: string;
  readonly port: number;
  /** A configuration file, given first as redis-server wants it (a Sentinel needs one it can rewrite). */
  readonly configFile?: string;
  /** Arguments after the port, bind and access arguments. */
  readonly args: readonly string[];
  readonly readyTimeoutMs?: number;
}

/** A client of the server's admin (the default user), failing fast instead of reconnecting: for a test's own set-up and checks. */
export function adminClientOptions(port: number, access: RedisAccess): RedisOptions {
  return {
    host: '127.0.0.1',
    port,
    password: access.password,
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    ...(access.tls ? { tls: { ca: access.tls.ca } } : {}),
  };
}

function listenArgs(port: number, access: RedisAccess): string[] {
  const tls = access.tls;
  const ports = tls
    ? [
        '--port',
        '0',
        '--tls-port',
        String(port),
        '--tls-cert-file',
        tls.certFile,
        '--tls-key-file',
        tls.keyFile,
        '--tls-ca-cert-file',
        tls.caFile,
        '--tls-auth-clients',
        'no',
      ]
    : ['--port', String(port)];
  return [...ports, '--bind', '127.0.0.1', ...(access.password ? ['--requirepass', access.password] : [])];
}

/** Spawns redis-server and resolves once it answers PING; rejects (with the server's stderr) if it exits first. */
export async function spawnRedis(options: SpawnRedisOptions): Promise<RedisProcess> {
  const file = options.configFile === undefined ? [] : [options.configFile];
  const child = spawn(options.binary ?? 'redis-server', [...file, ...listenArgs(options.port, options), '--daemonize', 'no', ...options.args], {
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
  const probeOptions = { ...adminClientOptions(options.port, options), connectTimeout: 1_000 };
  const deadline = Date.now() + (options.readyTimeoutMs ?? 15_000);
  for (;;) {
    const failure = await Promise.race([spawnError, sleep(0).then(() => null)]);
    if (failure) throw new Error(`cannot start ${options.binary ?? 'redis-server'}: ${failure.message}`);
    if (!alive()) throw new Error(`redis-server on port ${options.port} exited with code ${child.exitCode}: ${stderr.trim()}`);
    if (await answersPing(probeOptions)) return handle;
    if (Date.now() > deadline) {
      await handle.kill();
      throw new Error(`redis-server on port ${options.port} did not answer PING in time: ${stderr.trim()}`);
    }
    await sleep(50);
  }
}

async function answersPing(options: RedisOptions): Promise<boolean> {
  const probe = new Redis(options);
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
