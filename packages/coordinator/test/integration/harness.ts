/**
 * Drives the built daemon as a real child process against the real RabbitMQ
 * and Redis of this machine. Each test gets its own queue and key prefix.
 */
import { randomBytes } from 'node:crypto';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { Redis } from 'ioredis';
import { escapeGlob } from '@tally/shared';
import { resetNamespace } from '@tally/testkit';
import { ensureQueue, type Publish } from '@tally/workload';
import { readCounts } from '../../src/commands/counts.js';
import { readStats } from '../../src/commands/stats.js';

export const AMQP_URL = process.env.TALLY_AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
export const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
export const MAIN = fileURLToPath(new URL('../../src/main.js', import.meta.url));
export const CLI = fileURLToPath(new URL('../../src/cli.js', import.meta.url));

export function uniqueName(label: string): string {
  return `t.${label}.${Date.now().toString(36)}${randomBytes(3).toString('hex')}`;
}

export interface TestSpace {
  readonly queue: string;
  readonly prefix: string;
  readonly env: Record<string, string>;
}

/** The marker scope pinned by the running describe block (pinMarkerScope), or null: the daemon's default. */
let pinnedMarkerScope: 'part' | 'message' | null = null;

/**
 * For the tests of a describe block: their spaces lay prefixes out with this
 * marker scope unless a space sets TALLY_MARKER_SCOPE itself. For the tests
 * that read part-scoped markers, claims or crash windows from Redis by
 * shard; every other test runs the daemon's default (message-scoped
 * markers on this standalone Redis).
 */
export function pinMarkerScope(scope: 'part' | 'message'): void {
  before(() => {
    pinnedMarkerScope = scope;
  });
  after(() => {
    pinnedMarkerScope = null;
  });
}

export function testSpace(label: string, extra: Record<string, string> = {}): TestSpace {
  const name = uniqueName(label);
  const queue = name;
  const prefix = `${name}:`;
  const scope: Record<string, string> = pinnedMarkerScope === null ? {} : { TALLY_MARKER_SCOPE: pinnedMarkerScope };
  return {
    queue,
    prefix,
    env: { TALLY_QUEUE: queue, TALLY_PREFIX: prefix, TALLY_AMQP_URL: AMQP_URL, TALLY_REDIS_URL: REDIS_URL, TALLY_LOG_LEVEL: 'info', ...scope, ...extra },
  };
}

export interface DaemonProcess {
  readonly child: ChildProcess;
  readonly logs: string[];
  readonly stderr: string[];
  /** Resolves with the exit code (null when killed by a signal) and the signal. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  waitForLog(text: string, timeoutMs?: number): Promise<string>;
}

/** Every daemon spawned and not yet exited: a root hook kills them after each test, so a failing test leaves none running. */
const liveDaemons = new Set<ChildProcess>();

// A root-level hook (registered when a test file first imports the harness):
// no test starts a daemon in a `before` to share it, so none outlives its test.
afterEach(async function killLeftoverDaemons() {
  const leftovers = [...liveDaemons];
  await Promise.all(
    leftovers.map((child) => {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      return exited;
    }),
  );
});

export function spawnDaemon(env: Record<string, string>): DaemonProcess {
  const child = spawn(process.execPath, [MAIN], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  liveDaemons.add(child);
  child.once('exit', () => liveDaemons.delete(child));
  const logs: string[] = [];
  const stderr: string[] = [];
  let buffer = '';
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
    buffer += chunk;
    const lines = buffer.split('\n');
    buffer = lines.pop()!;
    logs.push(...lines);
  });
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => stderr.push(chunk));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  return {
    child,
    logs,
    stderr,
    exited,
    async waitForLog(text, timeoutMs = 20_000) {
      const deadline = Date.now() + timeoutMs;
      while (Date.now() < deadline) {
        const line = logs.find((l) => l.includes(text));
        if (line) return line;
        if (child.exitCode !== null || child.signalCode !== null) break;
        await sleep(25);
      }
      throw new Error(`daemon did not log ${JSON.stringify(text)}; stderr: ${stderr.join('')}; last logs:\n${logs.slice(-10).join('\n')}`);
    },
  };
}

/** Waits until the daemon has logged `text` at least `count` times. */
export async function waitForLogCount(daemon: DaemonProcess, text: string, count: number, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const seen = (): number => daemon.logs.filter((l) => l.includes(text)).length;
  while (seen() < count) {
    if (Date.now() > deadline || daemon.child.exitCode !== null || daemon.child.signalCode !== null) {
      throw new Error(`daemon logged ${JSON.stringify(text)} ${seen()} times, expected ${count}; last logs:\n${daemon.logs.slice(-10).join('\n')}`);
    }
    await sleep(25);
  }
}

/** Starts the daemon and waits until it consumes. */
export async function startDaemon(env: Record<string, string>): Promise<DaemonProcess> {
  const daemon = spawnDaemon(env);
  await daemon.waitForLog('"msg":"consuming"');
  return daemon;
}

/** How a daemon that was expected to refuse its start ended. */
export interface RefusedStart {
  readonly code: number | null;
  readonly stderr: string;
  readonly stderrLines: string[];
  /** The `code` of the `start failed` log record, if one was written. */
  readonly fatalCode: string | undefined;
  readonly logs: string[];
}

/** Runs the daemon to its exit; one still running after `timeoutMs` (a retry loop) is killed, and its exit fails the test. */
export async function runRefusedStart(env: Record<string, string>, timeoutMs = 30_000): Promise<RefusedStart> {
  const daemon = spawnDaemon(env);
  const timer = setTimeout(() => daemon.child.kill('SIGKILL'), timeoutMs);
  const exit = await daemon.exited;
  clearTimeout(timer);
  const fatal = daemon.logs.map((l) => JSON.parse(l) as { msg: string; code?: string }).find((record) => record.msg === 'start failed');
  const stderr = daemon.stderr.join('');
  return { code: exit.code, stderr, stderrLines: stderr.trim().split('\n'), fatalCode: fatal?.code, logs: daemon.logs };
}

export async function stopDaemon(daemon: DaemonProcess, timeoutMs = 40_000): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  if (daemon.child.exitCode !== null || daemon.child.signalCode !== null) return daemon.exited;
  daemon.child.kill('SIGTERM');
  const timer = setTimeout(() => daemon.child.kill('SIGKILL'), timeoutMs);
  try {
    return await daemon.exited;
  } finally {
    clearTimeout(timer);
  }
}

export function killDaemon(daemon: DaemonProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  daemon.child.kill('SIGKILL');
  return daemon.exited;
}

/** Ready messages (not counting unacked ones) and consumers of a queue. */
export async function queueState(queue: string): Promise<{ messageCount: number; consumerCount: number }> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    const channel = await connection.createChannel();
    channel.on('error', () => {});
    const reply = await channel.checkQueue(queue);
    return { messageCount: reply.messageCount, consumerCount: reply.consumerCount };
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Waits until fewer than `count` messages of the queue are ready: the consumer has made that much progress. */
export async function waitForReadyBelow(queue: string, count: number, timeoutMs = 120_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if ((await queueState(queue)).messageCount < count) return;
    await sleep(10);
  }
  throw new Error(`queue ${queue} still has ${count} or more ready messages after ${timeoutMs} ms`);
}

/** Waits until no message of the queue is ready (deliveries may still be unacked). */
export async function waitForReadyEmpty(queue: string, timeoutMs = 120_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if ((await queueState(queue)).messageCount === 0) return;
    await sleep(100);
  }
  throw new Error(`queue ${queue} still has ready messages after ${timeoutMs} ms`);
}

/**
 * Drains a queue completely with the daemon: runs it until nothing is ready,
 * stops it with SIGTERM (which finishes and acks what is in flight), and
 * repeats if anything came back. Asserts nothing itself; returns the exits.
 */
export async function drainWithDaemon(env: Record<string, string>, queue: string): Promise<Array<{ code: number | null; signal: NodeJS.Signals | null }>> {
  const exits = [];
  for (let round = 0; round < 5; round++) {
    const daemon = await startDaemon(env);
    await waitForReadyEmpty(queue);
    await sleep(300);
    exits.push(await stopDaemon(daemon));
    if ((await queueState(queue)).messageCount === 0) return exits;
  }
  throw new Error(`queue ${queue} did not drain`);
}

export async function withRedis<T>(run: (redis: Redis) => Promise<T>): Promise<T> {
  const redis = new Redis(REDIS_URL, { lazyConnect: false });
  try {
    return await run(redis);
  } finally {
    redis.disconnect();
  }
}

export async function countsOf(prefix: string, virtualShards = 16): Promise<Map<string, number>> {
  return withRedis(async (redis) => {
    const raw = await readCounts(redis, { prefix, virtualShards }, []);
    return new Map([...raw].map(([sku, value]) => [sku, Number(value)]));
  });
}

export async function statsOf(prefix: string): Promise<Awaited<ReturnType<typeof readStats>>> {
  return withRedis((redis) => readStats(redis, { prefix }));
}

/** Keys matching a pattern (SCAN, never KEYS). */
export async function keyCount(pattern: string): Promise<number> {
  return withRedis(async (redis) => {
    let cursor = '0';
    let total = 0;
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 10_000);
      cursor = next;
      total += keys.length;
    } while (cursor !== '0');
    return total;
  });
}

/** Batch receipts: one per shard batch written, in either mode. */
export const receiptCount = (prefix: string): Promise<number> => keyCount(`${escapeGlob(prefix)}w:{*}:*`);

/** Waits until a batch is written after `before` receipts existed: the daemon just started is at work. False on timeout. */
export async function waitForNewBatch(prefix: string, before: number, timeoutMs = 5_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if ((await receiptCount(prefix)) > before) return true;
    await sleep(10);
  }
  return false;
}

/** Publishes `chunk` messages every `everyMs` on one confirm channel: a stream, not a preload. */
export async function publishPaced(publishes: readonly Publish[], queue: string, chunk: number, everyMs: number): Promise<void> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    await ensureQueue(connection, queue);
    const channel = await connection.createConfirmChannel();
    for (let i = 0; i < publishes.length; i += chunk) {
      const started = Date.now();
      for (const publish of publishes.slice(i, i + chunk)) {
        channel.sendToQueue(queue, publish.body, { persistent: true, ...(publish.messageId !== undefined ? { messageId: publish.messageId } : {}) });
      }
      await channel.waitForConfirms();
      await sleep(Math.max(0, everyMs - (Date.now() - started)));
    }
    await channel.close();
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Removes a test's queues and keys. */
export async function cleanup(space: TestSpace): Promise<void> {
  await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix });
}

/** Reads every message of a queue (acking them). */
export async function drainQueue(queue: string): Promise<amqp.GetMessage[]> {
  const connection = await amqp.connect(AMQP_URL);
  const messages: amqp.GetMessage[] = [];
  try {
    const channel = await connection.createChannel();
    for (;;) {
      const message = await channel.get(queue, { noAck: true });
      if (message === false) break;
      messages.push(message);
    }
  } finally {
    await connection.close().catch(() => {});
  }
  return messages;
}

/** Differences between counts and truth: the one comparison `tally verify` and the bench use too. */
export { compareWithTruth as compare } from '@tally/workload';

const run = promisify(execFile);

/** Closes, from the broker's side, every connection whose client named itself with `namePrefix`. */
export async function closeConnections(connectionName: string): Promise<number> {
  const { stdout } = await run('rabbitmqctl', ['list_connections', '-q', '--no-table-headers', 'pid', 'client_properties'], { timeout: 30_000 });
  let closed = 0;
  for (const line of stdout.split('\n')) {
    // Quoted, so that pid 123 never matches the connection of pid 1234.
    if (!line.includes(`"${connectionName}"`)) continue;
    const pid = line.split('\t')[0]!.trim();
    await run('rabbitmqctl', ['close_connection', pid, 'test: simulated connection loss'], { timeout: 30_000 });
    closed++;
  }
  return closed;
}
