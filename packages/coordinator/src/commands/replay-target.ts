/**
 * Pure: where a replayed dead letter goes. With one queue, back to it. With
 * partitioned queues, back to the partition it came from: every copy of an
 * id belongs to one partition (the exchange hashes the id), and a replay
 * sent elsewhere could be consumed beside a redelivered copy by another
 * daemon. Tally's dead letters name their partition queue in
 * `x-tally-source-queue`; the broker's in x-death's `queue`. A dead letter
 * that names none of the deployment's partition queues is kept, not guessed.
 */
import { partitionQueues } from '@tally/shared';

export const SOURCE_QUEUE_HEADER = 'x-tally-source-queue';

export function replayQueueOf(headers: Record<string, unknown> | undefined, queue: string, partitions: number): string | null {
  if (partitions <= 1) return queue;
  const candidates: unknown[] = [headers?.[SOURCE_QUEUE_HEADER]];
  const deaths = headers?.['x-death'];
  if (Array.isArray(deaths)) for (const death of deaths) candidates.push((death as { queue?: unknown } | null)?.queue);
  const known = new Set(partitionQueues(queue, partitions));
  for (const candidate of candidates) if (typeof candidate === 'string' && known.has(candidate)) return candidate;
  return null;
}
