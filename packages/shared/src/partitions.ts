/**
 * Partitioned queues (TALLY_PARTITIONS=N > 1): the names, and which live
 * daemon consumes which partition. Pure: the daemon feeds it the live
 * heartbeats (heartbeat.ts) and subscribes to what it returns.
 *
 * With N = 1 there is one queue, TALLY_QUEUE, exactly as before partitions.
 * With N > 1 producers publish to the exchange TALLY_QUEUE (type
 * x-consistent-hash) with the message id as the routing key, so every copy
 * of an id lands on one partition queue, `<queue>.<p>` (invariant 14).
 */
import { fnv1a32 } from './shards.js';

/** The exchange type of the rabbitmq_consistent_hash_exchange plugin (ships with RabbitMQ, off by default). */
export const CONSISTENT_HASH_EXCHANGE = 'x-consistent-hash';

/**
 * The binding key of every partition queue: with the consistent-hash
 * exchange the binding key is the queue's weight (its number of points on
 * the hash ring). Equal weights, equal shares of the ids.
 */
export const PARTITION_WEIGHT = '1';

/** The work queue of partition `p` (0-based); TALLY_QUEUE itself when there is one partition. */
export function partitionQueue(queue: string, partitions: number, p: number): string {
  return partitions === 1 ? queue : `${queue}.${p}`;
}

/** Every work queue of the deployment, in partition order. */
export function partitionQueues(queue: string, partitions: number): string[] {
  return Array.from({ length: partitions }, (_, p) => partitionQueue(queue, partitions, p));
}

/**
 * How many partitions a daemon holds when D daemons share N: ⌊N/D⌋ or
 * ⌈N/D⌉. The first N mod D daemons (in id order) take one more.
 */
export function partitionShare(partitions: number, daemons: number, index: number): number {
  if (daemons <= 0) return 0;
  return Math.floor(partitions / daemons) + (index < partitions % daemons ? 1 : 0);
}

/**
 * The owner of every partition, from the set of live daemon ids only: every
 * daemon that sees the same set computes the same map, without talking to
 * the others (no lock service). Balanced (each daemon holds ⌊N/D⌋ or
 * ⌈N/D⌉) and sticky: each partition goes to the daemon ranking highest for
 * it (rendezvous hashing) among those with room left, so a daemon joining or
 * leaving moves mostly the partitions it takes or frees, not a reshuffle of
 * them all (which `p mod D` would be). Two daemons that briefly see
 * different sets may both subscribe to a partition: single active consumer
 * lets only one of them consume it, and the views agree at the next beat.
 *
 * Returns owners[p] = the id owning partition p; empty ids give no owners.
 */
export function assignPartitions(partitions: number, liveIds: Iterable<string>): string[] {
  if (!Number.isSafeInteger(partitions) || partitions < 1) throw new RangeError(`partitions must be a positive integer, got ${partitions}`);
  const ids = [...new Set(liveIds)].sort();
  if (ids.length === 0) return [];
  const room = new Map(ids.map((id, index) => [id, partitionShare(partitions, ids.length, index)]));
  const owners: string[] = [];
  for (let p = 0; p < partitions; p++) {
    const ranked = ids.map((id) => ({ id, score: fnv1a32(`${id}\u0000${p}`) })).sort((a, b) => b.score - a.score || (a.id < b.id ? -1 : 1));
    const owner = ranked.find(({ id }) => (room.get(id) ?? 0) > 0)!;
    room.set(owner.id, room.get(owner.id)! - 1);
    owners.push(owner.id);
  }
  return owners;
}

/** The partitions `self` owns among `liveIds` (itself included whether or not it is listed yet), ascending. */
export function partitionsOf(partitions: number, liveIds: Iterable<string>, self: string): number[] {
  const owners = assignPartitions(partitions, [...liveIds, self]);
  const mine: number[] = [];
  owners.forEach((owner, p) => {
    if (owner === self) mine.push(p);
  });
  return mine;
}
