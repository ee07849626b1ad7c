import { writeFile } from 'node:fs/promises';
import { generateWorkload, publishAll, WORKLOAD_DEFAULTS, type WorkloadOptions } from '@tally/workload';
import { CliUsageError, redactUrl, type TallyConfig } from '@tally/shared';

export interface PublishFlags {
  readonly messages?: string;
  readonly skus?: string;
  readonly changes?: string;
  readonly 'duplicate-rate'?: string;
  readonly 'bad-rate'?: string;
  readonly seed?: string;
  readonly types?: string;
  readonly zipf?: string;
  readonly 'id-prefix'?: string;
  readonly deltas?: string;
  readonly truth?: string;
}

function number(flag: string, raw: string | undefined, fallback: number, min: number, max: number, integer = true): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < min || value > max || (integer && !Number.isInteger(value))) {
    throw new CliUsageError(`--${flag}: expected ${integer ? 'an integer' : 'a number'} from ${min} to ${max}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

function range(flag: string, raw: string | undefined, fallback: [number, number], min: number, max: number): [number, number] {
  if (raw === undefined) return fallback;
  const match = /^(-?\d+)(?:-(-?\d+))?$/.exec(raw);
  if (!match) throw new CliUsageError(`--${flag}: expected N or MIN-MAX, got ${JSON.stringify(raw)}`);
  const low = number(flag, match[1], 0, min, max);
  const high = number(flag, match[2] ?? match[1], 0, min, max);
  if (high < low) throw new CliUsageError(`--${flag}: MIN must not exceed MAX, got ${raw}`);
  return [low, high];
}

export function workloadFromFlags(flags: PublishFlags, config: Pick<TallyConfig, 'acceptTypes' | 'maxMessageBytes'>): WorkloadOptions {
  const [minChanges, maxChanges] = range('changes', flags.changes, [1, 8], 1, 10_000);
  const [minDelta, maxDelta] = range('deltas', flags.deltas, [1, 9], -1_000_000, 1_000_000);
  return {
    ...WORKLOAD_DEFAULTS,
    messages: number('messages', flags.messages, 10_000, 1, 100_000_000),
    skus: number('skus', flags.skus, 1_000, 1, 10_000_000),
    minChanges,
    maxChanges,
    minDelta,
    maxDelta,
    duplicateRate: number('duplicate-rate', flags['duplicate-rate'], 0.02, 0, 10, false),
    badRate: number('bad-rate', flags['bad-rate'], 0, 0, 10, false),
    seed: number('seed', flags.seed, Date.now() % 2 ** 31, 0, 2 ** 32 - 1),
    types: flags.types ? flags.types.split(',').map((t) => t.trim()).filter(Boolean) : [],
    acceptTypes: config.acceptTypes,
    zipf: number('zipf', flags.zipf, 0, 0, 10, false),
    idPrefix: flags['id-prefix'] ?? `msg-${Date.now().toString(36)}`,
    maxBytes: config.maxMessageBytes,
  };
}

export async function publishCommand(flags: PublishFlags, config: TallyConfig, out: (line: string) => void): Promise<void> {
  const options = workloadFromFlags(flags, config);
  const workload = generateWorkload(options);
  const started = performance.now();
  const published = await publishAll(workload.publishes, { url: config.amqpUrl, queue: config.queue });
  const seconds = (performance.now() - started) / 1000;
  const summary = {
    queue: config.queue,
    broker: redactUrl(config.amqpUrl),
    published,
    good: workload.good,
    duplicates: workload.duplicates,
    bad: workload.bad,
    skus: workload.truth.size,
    seed: options.seed,
    idPrefix: options.idPrefix,
    seconds: Number(seconds.toFixed(2)),
  };
  if (flags.truth) {
    await writeFile(
      flags.truth,
      JSON.stringify({ ...summary, badReasons: Object.fromEntries(workload.badReasons), counts: Object.fromEntries(workload.truth) }),
    );
  }
  out(JSON.stringify(summary));
}
