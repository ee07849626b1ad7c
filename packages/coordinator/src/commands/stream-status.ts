/**
 * `tally status` for TALLY_SOURCE=stream: each partition's stream as the
 * broker has it (first and last offsets), its committed checkpoint, the lag
 * between them, and the daemon(s) whose heartbeat holds it. A stream's
 * depth is no use (the broker reports 0 messages for a stream): the lag is
 * the distance from the checkpoint to the last offset.
 */
import type amqp from 'amqplib';
import { partitionQueue, type TallyConfig } from '@tally/shared';
import type { RedisClient } from '@tally/runtime';
import { probeBounds } from '../amqp/stream-source.js';
import type { LiveDaemon } from '../fleet/heartbeat.js';
import { CheckpointStore } from '../stream/checkpoint-store.js';

export interface StreamPartitionStatus {
  readonly partition: number;
  readonly stream: string;
  /** The stream's first and last offsets; null when it is empty or the broker could not be asked. */
  readonly first: number | null;
  readonly last: number | null;
  /** The committed checkpoint: every message up to it is applied; null before the first commit. */
  readonly committed: number | null;
  /** When it was committed (ISO time). */
  readonly committed_at: string | null;
  /** Offsets between the checkpoint and the last one (messages to read, give or take one per segment). */
  readonly lag: number | null;
  /** Times the partition was rewound after Redis lost writes. */
  readonly rewinds: number;
  /** Ids of the live daemons whose heartbeat holds it. */
  readonly held_by: string[];
}

export async function readStreamStatus(
  redis: RedisClient,
  broker: amqp.ChannelModel | null,
  config: Pick<TallyConfig, 'prefix' | 'queue' | 'partitions'>,
  daemons: readonly LiveDaemon[],
): Promise<StreamPartitionStatus[]> {
  const checkpoints = await new CheckpointStore(redis, config.prefix).readAll();
  const out: StreamPartitionStatus[] = [];
  for (let partition = 0; partition < config.partitions; partition++) {
    const stream = config.partitions === 1 ? config.queue : partitionQueue(config.queue, config.partitions, partition);
    const bounds = broker === null ? null : await probeBounds(broker, stream).catch(() => null);
    const checkpoint = checkpoints.get(partition) ?? null;
    const committed = checkpoint === null || checkpoint.offset < 0 ? null : checkpoint.offset;
    out.push({
      partition,
      stream,
      first: bounds?.first ?? null,
      last: bounds?.last ?? null,
      committed,
      committed_at: checkpoint === null ? null : new Date(checkpoint.at).toISOString(),
      lag: bounds === null ? null : Math.max(0, bounds.last - (committed ?? bounds.first - 1)),
      rewinds: checkpoint?.rewinds ?? 0,
      held_by: daemons.filter((d) => d.queue === config.queue && d.partitions.includes(partition)).map((d) => d.id),
    });
  }
  return out;
}
