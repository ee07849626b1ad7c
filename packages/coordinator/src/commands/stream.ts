/**
 * `tally stream reset --partition P [--force]`: forgets what a prefix knows
 * of one stream partition (its checkpoint, and its watermark on every
 * shard), so the partition's next owner counts the stream from its first
 * message. The fix a daemon names when it refuses a partition whose stream
 * was deleted and recreated (resume-plan.ts, stream-cursor.ts).
 *
 * Forgetting a stream that is still the one checkpointed would count it all
 * again, so the command checks first, as a resuming daemon would: the
 * stream's bounds against the checkpoint, and the checkpointed offset's
 * message against the checkpointed body. Only a stream that is not the one
 * checkpointed is reset, unless --force.
 */
import { CliUsageError, layoutKey, partitionQueue, TallyError, watermarkKey, type TallyConfig } from '@tally/shared';
import type { RedisClient } from '@tally/runtime';
import type { ChannelModel } from 'amqplib';
import { connectAnyNode } from '../amqp/broker-connect.js';
import { probeBounds } from '../amqp/stream-source.js';
import { CheckpointStore } from '../stream/checkpoint-store.js';
import type { CheckpointRecord } from '../stream/checkpoint-record.js';
import { planResume } from '../stream/resume-plan.js';
import { bodyHash } from '../stream/stream-cursor.js';

export interface StreamResetReport {
  readonly partition: number;
  readonly stream: string;
  /** Why the stream is not the one checkpointed; null when it is (then reset only with --force). */
  readonly mismatch: string | null;
  readonly checkpoint: number | null;
  readonly reset: boolean;
  readonly forced: boolean;
}

export async function streamReset(
  redis: RedisClient,
  config: TallyConfig,
  options: { partition?: string | undefined; force: boolean },
): Promise<StreamResetReport> {
  if (options.partition === undefined || !/^\d+$/.test(options.partition)) throw new CliUsageError('stream reset needs --partition P (a partition number)');
  const partition = Number(options.partition);
  if (partition >= config.partitions)
    throw new CliUsageError(`--partition ${partition}: TALLY_PARTITIONS is ${config.partitions}, partitions are 0 to ${config.partitions - 1}`);
  const stream = config.partitions === 1 ? config.queue : partitionQueue(config.queue, config.partitions, partition);
  const store = new CheckpointStore(redis, config.prefix);
  const checkpoint = await store.read(partition);
  const broker = await connectAnyNode(config.amqpNodes, 'tally-cli');
  let mismatch: string | null;
  try {
    mismatch = await streamMismatch(broker.model, stream, checkpoint);
  } finally {
    await broker.model.close().catch(() => {});
  }
  if (mismatch === null && !options.force) {
    throw new TallyError(
      'TALLY_CLI_USAGE',
      `${stream} is the stream partition ${partition} was checkpointed on (offset ${checkpoint?.offset ?? 'none'}): a reset would count it again from its start; ` +
        `add --force only if that is what you want`,
    );
  }
  const virtualShards = Number(await redis.hget(layoutKey(config.prefix), 'virtual_shards')) || config.virtualShards;
  // Every shard's watermark of the partition goes, or the new stream's low offsets would be skipped as applied.
  for (let vshard = 0; vshard < virtualShards; vshard++) await redis.hdel(watermarkKey(config.prefix, vshard), String(partition));
  await store.reset(partition);
  return { partition, stream, mismatch, checkpoint: checkpoint?.offset ?? null, reset: true, forced: mismatch === null };
}

/** Why `stream` is not the stream `checkpoint` was taken on, or null when it is (or there is no checkpoint to contradict). */
async function streamMismatch(model: ChannelModel, stream: string, checkpoint: CheckpointRecord | null): Promise<string | null> {
  if (checkpoint === null) return null;
  const bounds = await probeBounds(model, stream);
  const plan = planResume({ checkpoint, bounds, windowMs: 0 });
  if (plan.kind === 'refuse') return plan.reason;
  if (plan.confirm === null) return null;
  const body = await messageAt(model, stream, plan.confirm.offset);
  if (body === null) return `offset ${plan.confirm.offset}, checkpointed, is not in the stream`;
  const found = bodyHash(body.content);
  return body.offset === plan.confirm.offset && found === plan.confirm.body
    ? null
    : `offset ${plan.confirm.offset} holds another message than the one checkpointed there`;
}

/** The first message at or after `offset`, with its offset; null when none comes. */
async function messageAt(model: ChannelModel, stream: string, offset: number): Promise<{ offset: number; content: Buffer } | null> {
  const channel = await model.createChannel();
  channel.on('error', () => {});
  try {
    await channel.prefetch(1);
    return await new Promise((resolve) => {
      const timer = setTimeout(() => resolve(null), 2_000);
      void channel
        .consume(
          stream,
          (message) => {
            clearTimeout(timer);
            if (message === null) return resolve(null);
            resolve({ offset: message.properties.headers?.['x-stream-offset'] as number, content: message.content });
          },
          { noAck: false, arguments: { 'x-stream-offset': offset } },
        )
        .catch(() => resolve(null));
    });
  } finally {
    await channel.close().catch(() => {});
  }
}

export function streamResetText(report: StreamResetReport): string {
  const why = report.mismatch === null ? 'forced: the stream was the one checkpointed' : report.mismatch;
  return `partition ${report.partition} (${report.stream}) reset: checkpoint ${report.checkpoint ?? 'none'} and its watermarks forgotten (${why}); its next owner counts it from its first message`;
}
