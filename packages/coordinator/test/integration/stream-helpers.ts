/**
 * What the stream tests share: a space with TALLY_SOURCE=stream, the
 * streams' bounds as the broker has them, and the wait for every stream to
 * be checkpointed up to its last offset (a stream never empties, so this is
 * how a test knows the daemons have read everything).
 */
import amqp from 'amqplib';
import { partitionQueues } from '@tally/shared';
import { probeBounds } from '../../src/amqp/stream-source.js';
import { CheckpointStore } from '../../src/stream/checkpoint-store.js';
import type { StreamBounds } from '../../src/stream/resume-plan.js';
import { until } from './fleet-helpers.js';
import { AMQP_URL, testSpace, withRedis, type TestSpace } from './harness.js';

export function streamSpace(label: string, partitions: number, extra: Record<string, string> = {}): TestSpace & { partitions: number; streams: string[] } {
  const space = testSpace(label, {
    TALLY_SOURCE: 'stream',
    TALLY_PARTITIONS: String(partitions),
    TALLY_HEARTBEAT_MS: '500',
    TALLY_STREAM_CHECKPOINT_MS: '200',
    TALLY_WORKERS: '1',
    TALLY_BATCH_SIZE: '100',
    TALLY_PREFETCH: '300',
    ...extra,
  });
  return { ...space, partitions, streams: partitions === 1 ? [space.queue] : partitionQueues(space.queue, partitions) };
}

/** Each stream's bounds now (null: empty). */
export async function streamBounds(streams: readonly string[]): Promise<Array<StreamBounds | null>> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    const out: Array<StreamBounds | null> = [];
    for (const stream of streams) out.push(await probeBounds(connection, stream));
    return out;
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Every partition's committed checkpoint, by partition. */
export async function checkpointsOf(prefix: string): Promise<Map<number, { offset: number; rewinds: number }>> {
  return withRedis(async (redis) => new CheckpointStore(redis, prefix).readAll());
}

/** Waits until every stream's checkpoint reaches its last offset: the daemons have read and applied everything. */
export async function caughtUp(space: TestSpace & { streams: string[] }, timeoutMs = 120_000): Promise<void> {
  const bounds = await streamBounds(space.streams);
  await until(
    'every stream checkpointed to its last offset',
    async () => {
      const checkpoints = await checkpointsOf(space.prefix);
      return bounds.every((b, p) => b === null || (checkpoints.get(p)?.offset ?? -1) >= b.last) ? true : undefined;
    },
    timeoutMs,
  );
}
