/**
 * Starting and stopping each contender as a child process of the bench, so
 * its CPU time and peak RSS are its own: the ceiling, naive and batched consumers in
 * ./consumers, and the real Tally daemon (its built entry, as `pnpm start`
 * runs it) configured only through TALLY_* variables.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { readsStream, type ContenderName } from './results.js';
import { SETTINGS_ENV, type ConsumerReport, type ConsumerSettings } from './consumers/protocol.js';

/** The daemon's built entry, found through the declared @tally/coordinator dependency (resolved, not imported: importing would start it). */
export const DAEMON_MAIN = fileURLToPath(import.meta.resolve('@tally/coordinator/main'));
const CONSUMERS: Partial<Record<ContenderName, string>> = {
  ceiling: fileURLToPath(new URL('./consumers/ceiling.js', import.meta.url)),
  naive: fileURLToPath(new URL('./consumers/naive.js', import.meta.url)),
  batched: fileURLToPath(new URL('./consumers/batched.js', import.meta.url)),
  'ceiling-stream': fileURLToPath(new URL('./consumers/ceiling.js', import.meta.url)),
};

export interface ContenderRun {
  readonly contender: ContenderName;
  readonly queue: string;
  readonly prefix: string;
  readonly amqpUrl: string;
  readonly redisUrl: string;
  readonly prefetch: number;
  readonly ackEvery: number;
  readonly ackWaitMs: number;
  readonly expected: number;
  readonly recordLatency: boolean;
  /** Extra TALLY_* variables for the daemon (--tally-env, then the sweeps' TALLY_BATCH_SIZE, TALLY_WORKERS). */
  readonly tallyEnv?: Readonly<Record<string, string>>;
  /** OTLP/HTTP endpoint the traced contender exports every span to. */
  readonly traceSinkUrl?: string;
  /** Extra node flags (the profile run: --cpu-prof). */
  readonly nodeArgs?: readonly string[];
  /** Deliveries of the warm-up at the head of the queue (the consumers report `warm` once they acked them). */
  readonly warmup?: number;
  /** The daemon's TALLY_METRICS_PORT: the drains read its progress there. */
  readonly metricsPort?: number;
}

export interface RunningContender {
  readonly pid: number;
  /** Epoch ms at which the contender started consuming, by its own clock reading. */
  readonly consumingAt: number;
  /** Resolves with the consumer's `done` report (ceiling, naive, batched only). */
  readonly done: Promise<Extract<ConsumerReport, { event: 'done' }>>;
  /** Resolves with the consumer's `warm` report, once it acked the warm-up (ceiling, naive, batched only). */
  readonly warm: Promise<Extract<ConsumerReport, { event: 'warm' }>>;
  /** The daemon's "shard layout verified" log line (Tally only): whether it created the prefix's layout or found one. */
  layoutLine(): Record<string, unknown> | null;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  alive(): boolean;
  stderr(): string;
  /** SIGTERM, then SIGKILL after the grace period; resolves with the exit. */
  stop(graceMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** Every child the bench started and has not seen exit, so an interrupted bench can kill exactly those. */
export const liveChildren = new Set<ChildProcess>();

export function isTally(contender: ContenderName): boolean {
  return (
    contender === 'tally-two-step' ||
    contender === 'tally-native-claims' ||
    contender === 'tally-atomic' ||
    contender === 'tally-traced' ||
    contender === 'tally-stream'
  );
}

function childFor(run: ContenderRun): ChildProcess {
  const nodeArgs = [...(run.nodeArgs ?? [])];
  if (isTally(run.contender)) {
    const env = {
      ...process.env,
      TALLY_AMQP_URL: run.amqpUrl,
      TALLY_REDIS_URL: run.redisUrl,
      TALLY_QUEUE: run.queue,
      TALLY_PREFIX: run.prefix,
      TALLY_PREFETCH: String(run.prefetch),
      // A stream has no mode (TALLY_MODE beside TALLY_SOURCE=stream stops the start).
      ...(run.contender === 'tally-stream' ? { TALLY_SOURCE: 'stream' } : { TALLY_MODE: run.contender === 'tally-atomic' ? 'atomic' : 'two-step' }),
      TALLY_LOG_LEVEL: 'info',
      ...(run.metricsPort !== undefined ? { TALLY_METRICS_PORT: String(run.metricsPort) } : {}),
      ...run.tallyEnv,
      // The claim pipeline's worth: the same two-step daemon with new parts claimed by native commands.
      ...(run.contender === 'tally-native-claims' ? { TALLY_MARKER_NATIVE_CLAIMS: 'true' } : {}),
      // Tracing's cost: every batch sampled, exported over OTLP/HTTP protobuf as to Jaeger.
      ...(run.contender === 'tally-traced'
        ? {
            OTEL_EXPORTER_OTLP_ENDPOINT: run.traceSinkUrl ?? 'http://127.0.0.1:4318',
            OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
            OTEL_TRACES_SAMPLER: 'always_on',
          }
        : {}),
    };
    return spawn(process.execPath, [...nodeArgs, DAEMON_MAIN], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  }
  const script = CONSUMERS[run.contender];
  if (!script) throw new Error(`no consumer script for ${run.contender}`);
  const settings: ConsumerSettings = {
    amqpUrl: run.amqpUrl,
    queue: run.queue,
    prefetch: run.prefetch,
    expected: run.expected,
    ...(run.warmup !== undefined ? { warmup: run.warmup } : {}),
    recordLatency: run.recordLatency,
    ackEvery: run.ackEvery,
    ackWaitMs: run.ackWaitMs,
    redisUrl: run.redisUrl,
    prefix: run.prefix,
    ...(readsStream(run.contender) ? { stream: true } : {}),
  };
  return spawn(process.execPath, [...nodeArgs, script], {
    env: { ...process.env, [SETTINGS_ENV]: JSON.stringify(settings) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

/** Parses a stdout line: the consumers' reports and the daemon's pino logs are both JSON. */
function parseLine(line: string): Record<string, unknown> | null {
  try {
    const value: unknown = JSON.parse(line);
    return typeof value === 'object' && value !== null ? (value as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

export async function startContender(run: ContenderRun, startTimeoutMs = 30_000): Promise<RunningContender> {
  const child = childFor(run);
  liveChildren.add(child);
  const stderr: string[] = [];
  const tail: string[] = [];
  let consumingResolve!: (at: number) => void;
  let doneResolve!: (report: Extract<ConsumerReport, { event: 'done' }>) => void;
  let doneReject!: (error: Error) => void;
  const consuming = new Promise<number>((resolve) => (consumingResolve = resolve));
  const done = new Promise<Extract<ConsumerReport, { event: 'done' }>>((resolve, reject) => {
    doneResolve = resolve;
    doneReject = reject;
  });
  done.catch(() => {});
  let warmResolve!: (report: Extract<ConsumerReport, { event: 'warm' }>) => void;
  const warm = new Promise<Extract<ConsumerReport, { event: 'warm' }>>((resolve) => (warmResolve = resolve));
  let layoutLine: Record<string, unknown> | null = null;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => {
      liveChildren.delete(child);
      doneReject(new Error(`${run.contender} exited (code ${code}, signal ${signal}) before reporting done; stderr: ${stderr.join('').slice(-500)}`));
      resolve({ code, signal });
    }),
  );
  let buffer = '';
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
    buffer += chunk;
    const lines = buffer.split('\n');
    buffer = lines.pop()!;
    for (const line of lines) {
      const value = parseLine(line);
      if (value === null) continue;
      if (value.event === 'consuming' && typeof value.at === 'number') consumingResolve(value.at);
      else if (value.msg === 'consuming') consumingResolve(typeof value.time === 'number' ? value.time : Date.now());
      else if (value.event === 'warm') warmResolve(value as unknown as Extract<ConsumerReport, { event: 'warm' }>);
      else if (value.msg === 'shard layout verified') layoutLine = value;
      else if (value.event === 'done') doneResolve(value as unknown as Extract<ConsumerReport, { event: 'done' }>);
      else if (value.event === 'error') doneReject(new Error(`${run.contender}: ${String(value.message)}`));
      if (typeof value.level === 'number' && value.level >= 40) tail.push(line.slice(0, 300));
    }
  });
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => stderr.push(chunk));

  const timeout = new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), startTimeoutMs).unref());
  const first = await Promise.race([consuming, exited, timeout]);
  if (first === 'timeout' || typeof first !== 'number') {
    if (first === 'timeout') child.kill('SIGKILL');
    const exit = first === 'timeout' ? await exited : first;
    const text = stderr.join('').trim();
    throw new Error(`${run.contender} did not start consuming (exit ${exit.code ?? exit.signal ?? 'timeout'}): ${text.slice(-500)} ${tail.join(' ')}`);
  }

  return {
    pid: child.pid!,
    consumingAt: first,
    done,
    warm,
    layoutLine: () => layoutLine,
    exited,
    alive: () => child.exitCode === null && child.signalCode === null,
    stderr: () => `${stderr.join('')}${tail.length > 0 ? `\nwarnings: ${tail.slice(-5).join('\n')}` : ''}`,
    async stop(graceMs = 40_000) {
      if (child.exitCode !== null || child.signalCode !== null) return exited;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      try {
        return await exited;
      } finally {
        clearTimeout(timer);
      }
    },
  };
}
