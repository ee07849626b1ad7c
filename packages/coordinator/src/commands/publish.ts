/**
 * `tally publish`: a generated, seeded test load published with confirms (to the queue, the partitions'
 * exchange or the stream), a producer span per message when tracing is on, and optionally its ground truth.
 */
import { writeFile } from 'node:fs/promises';
import { context, propagation, SpanKind, trace, type Tracer } from '@opentelemetry/api';
import { connectAnyNode } from '../amqp/broker-connect.js';
import { generateWorkload, publishTarget, MESSAGE_SHAPES, WORKLOAD_DEFAULTS, type MessageShape, type Publish, type WorkloadOptions } from '@tally/workload';
import { CliUsageError, redactUrl, type TallyConfig } from '@tally/shared';
import {
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_MESSAGE_ID,
  ATTR_MESSAGING_OPERATION_NAME,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  MESSAGING_OPERATION_TYPE_VALUE_SEND,
  MESSAGING_SYSTEM_VALUE_RABBITMQ,
} from '../telemetry/semconv.js';
import { PublishProgress } from './publish-progress.js';

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
  readonly shape?: string;
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

/** --shape: the contract's message shape, or the foreign one FOREIGN_SHAPE_MAPPING reads (the daemon needs that mapping set). */
function shape(raw: string | undefined): MessageShape {
  if (raw === undefined) return 'contract';
  if (!(MESSAGE_SHAPES as readonly string[]).includes(raw))
    throw new CliUsageError(`--shape: expected one of ${MESSAGE_SHAPES.join(', ')}, got ${JSON.stringify(raw)}`);
  return raw as MessageShape;
}

export function workloadFromFlags(flags: PublishFlags, config: Pick<TallyConfig, 'acceptTypes' | 'maxMessageBytes'>): WorkloadOptions {
  const [minChanges, maxChanges] = range('changes', flags.changes, [1, 8], 1, 10_000);
  const [minDelta, maxDelta] = range('deltas', flags.deltas, [1, 9], -1_000_000, 1_000_000);
  return {
    ...WORKLOAD_DEFAULTS,
    shape: shape(flags.shape),
    messages: number('messages', flags.messages, 10_000, 1, 100_000_000),
    skus: number('skus', flags.skus, 1_000, 1, 10_000_000),
    minChanges,
    maxChanges,
    minDelta,
    maxDelta,
    duplicateRate: number('duplicate-rate', flags['duplicate-rate'], 0.02, 0, 10, false),
    badRate: number('bad-rate', flags['bad-rate'], 0, 0, 10, false),
    seed: number('seed', flags.seed, Date.now() % 2 ** 31, 0, 2 ** 32 - 1),
    types: flags.types
      ? flags.types
          .split(',')
          .map((t) => t.trim())
          .filter(Boolean)
      : [],
    acceptTypes: config.acceptTypes,
    zipf: number('zipf', flags.zipf, 0, 0, 10, false),
    idPrefix: flags['id-prefix'] ?? `msg-${Date.now().toString(36)}`,
    maxBytes: config.maxMessageBytes,
  };
}

/** Confirms are awaited every this many messages (and whenever the channel asks to slow down). */
const CONFIRM_EVERY = 2_000;

/**
 * Publishes persistent messages with publisher confirms: when this resolves
 * the broker holds every one. With tracing on, each message gets a producer
 * span (`send <queue>`) whose context travels in its `traceparent` header, so
 * the batch that counts it links back to it; with tracing off the API is a
 * no-op and no header is added.
 */
export async function publishWorkload(
  publishes: readonly Publish[],
  options: { url: string; queue: string; partitions?: number; stream?: boolean; tracer: Tracer; onProgress?: (published: number) => void },
): Promise<number> {
  const { model: connection } = await connectAnyNode(options.url, `tally-publish-${process.pid}`);
  try {
    const channel = await connection.createConfirmChannel();
    // With TALLY_PARTITIONS > 1: the consistent-hash exchange, the message id as the routing key.
    const target = await publishTarget(connection, channel, options.queue, options.partitions ?? 1, options.stream ?? false);
    let published = 0;
    for (const publish of publishes) {
      const span = options.tracer.startSpan(`send ${options.queue}`, {
        kind: SpanKind.PRODUCER,
        attributes: {
          [ATTR_MESSAGING_SYSTEM]: MESSAGING_SYSTEM_VALUE_RABBITMQ,
          [ATTR_MESSAGING_DESTINATION_NAME]: options.queue,
          [ATTR_MESSAGING_OPERATION_TYPE]: MESSAGING_OPERATION_TYPE_VALUE_SEND,
          [ATTR_MESSAGING_OPERATION_NAME]: 'publish',
          ...(publish.id !== undefined ? { [ATTR_MESSAGING_MESSAGE_ID]: publish.id } : {}),
        },
      });
      const headers: Record<string, string> = { ...publish.headers };
      if (span.isRecording()) propagation.inject(trace.setSpan(context.active(), span), headers);
      const ok = target.send(publish, {
        persistent: true,
        contentType: 'application/json',
        timestamp: Date.now(),
        ...(publish.messageId !== undefined ? { messageId: publish.messageId } : {}),
        ...(Object.keys(headers).length > 0 ? { headers } : {}),
      });
      span.end();
      published++;
      if (!ok || published % CONFIRM_EVERY === 0) {
        await channel.waitForConfirms();
        options.onProgress?.(published);
      }
    }
    await channel.waitForConfirms();
    target.check();
    options.onProgress?.(published);
    await channel.close();
    return published;
  } finally {
    await connection.close().catch(() => {});
  }
}

export async function publishCommand(
  flags: PublishFlags,
  config: TallyConfig,
  out: (line: string) => void,
  terminal: { isTTY: boolean; write: (text: string) => void } = { isTTY: process.stderr.isTTY === true, write: (text) => process.stderr.write(text) },
): Promise<void> {
  const options = workloadFromFlags(flags, config);
  const workload = generateWorkload(options);
  const progress = terminal.isTTY ? new PublishProgress(workload.publishes.length, terminal.write) : null;
  const started = performance.now();
  let published: number;
  try {
    published = await publishWorkload(workload.publishes, {
      url: config.amqpUrl,
      queue: config.queue,
      partitions: config.partitions,
      stream: config.source === 'stream',
      tracer: trace.getTracer('tally.publish'),
      onProgress: (done) => progress?.update(done),
    });
  } finally {
    progress?.finish();
  }
  const seconds = (performance.now() - started) / 1000;
  const summary = {
    queue: config.queue,
    broker: redactUrl(config.amqpUrl),
    published,
    good: workload.good,
    duplicates: workload.duplicates,
    bad: workload.bad,
    skus: workload.truth.size,
    shape: options.shape,
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
