/**
 * What the bench's own consumer processes (ceiling, naive) are told and
 * what they report back: settings as one JSON environment variable in, JSON
 * lines on stdout out.
 */

export const SETTINGS_ENV = 'BENCH_CONSUMER_SETTINGS';

export interface ConsumerSettings {
  readonly amqpUrl: string;
  readonly queue: string;
  readonly prefetch: number;
  /** Deliveries the run must ack; the consumer reports `done` when it has. */
  readonly expected: number;
  /**
   * Deliveries of the warm-up load at the head of the queue (part of
   * `expected`): the consumer reports `warm` once it has acked that many, and
   * the bench's measured window starts there. 0 or absent: no warm-up.
   */
  readonly warmup?: number;
  /** Record publish-timestamp-to-ack latency of every delivery (latency runs only). */
  readonly recordLatency: boolean;
  /** ceiling: multiple-ack every this many deliveries... */
  readonly ackEvery: number;
  /** ...or once the oldest unacked delivery waited this long (the daemon's TALLY_BATCH_WAIT_MS default). */
  readonly ackWaitMs: number;
  /** Read the queue as a stream, from its first offset (the ceiling of a stream). */
  readonly stream?: boolean;
  /** naive and batched only. */
  readonly redisUrl?: string;
  readonly prefix?: string;
  readonly markerTtlS?: number;
  readonly countTtlS?: number;
  readonly virtualShards?: number;
}

export type ConsumerReport =
  | { readonly event: 'consuming'; readonly at: number }
  | { readonly event: 'warm'; readonly at: number; readonly acked: number }
  | {
      readonly event: 'done';
      readonly at: number;
      readonly acked: number;
      readonly duplicates: number;
      readonly samples?: Array<[publishedAt: number, latencyMs: number]>;
    }
  | { readonly event: 'error'; readonly message: string };

export function readSettings(env: NodeJS.ProcessEnv): ConsumerSettings {
  const raw = env[SETTINGS_ENV];
  if (!raw) throw new Error(`${SETTINGS_ENV} is not set`);
  return JSON.parse(raw) as ConsumerSettings;
}

export function report(line: ConsumerReport): void {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

/** Call after every ack with the total acked: reports `warm` the first time the total reaches the warm-up's deliveries. */
export function warmupReporter(warmup: number | undefined): (acked: number) => void {
  let pending = (warmup ?? 0) > 0;
  return (acked) => {
    if (!pending || acked < warmup!) return;
    pending = false;
    report({ event: 'warm', at: Date.now(), acked });
  };
}

/** Exits on SIGTERM after `close`, like the daemon does. */
export function onTerminate(close: () => Promise<void>): void {
  const stop = () => {
    close().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}
