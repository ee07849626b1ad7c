/**
 * The broker side of `tally dead list` and `tally dead replay`.
 *
 * AMQP 0-9-1 has no way to look at a queue without taking its messages, so
 * both commands take them with basic.get and manual acks, one pass front to
 * back, bounded by the message count seen at the start (dead letters that
 * arrive meanwhile are left for the next run), and give back what they keep
 * with ONE `basic.nack(multiple, requeue)` at the end. RabbitMQ puts requeued
 * messages back at their original positions, so what stays keeps its order;
 * nack (not reject) leaves a quorum queue's delivery count alone. If the
 * command dies instead, the broker requeues every unacked message the same
 * way when the connection drops: nothing read is ever lost.
 *
 * Replay moves a message by publishing a copy to the work queue (persistent,
 * mandatory, with publisher confirms) and only then acking the dead one, one
 * message at a time. A crash between the confirm and the ack leaves at most
 * that one message in both queues: the copy counts, the dead one is replayed
 * again later and its marker recognises it (within TALLY_MARKER_TTL_S).
 *
 * A dead letter that may have been counted and whose markers may have
 * expired (replay-guard.ts, invariant 15) is not moved: it is kept in place
 * like one of another reason, unless `force`, which moves it and reports
 * each one (`onForced`) before its dead copy is acked.
 */
import amqp, { type ConfirmChannel, type GetMessage, type Options } from 'amqplib';
import {
  COUNT_REFUSED,
  DEAD_AT_HEADER,
  FIRST_DEAD_AT_HEADER,
  partitionQueue,
  QueueMissingError,
  ReplayRefusedError,
  STANDING_COUNTS_HEADER,
  type MessageMapping,
  type StandingCounts,
} from '@tally/shared';
import { connectAnyNode } from '../amqp/broker-connect.js';
import { copyPublishOptions } from '../amqp/message-copy.js';
import { replayQueueOf, SOURCE_QUEUE_HEADER } from './replay-target.js';
import { describeDeadLetter, DeadLetterSummary, REASON_HEADER, type DeadLetterEntry } from './dead-summary.js';
import { firstDeadAt, replayVerdict, RiskSummary, type ReplayPolicy } from './replay-guard.js';

export interface DeadQueueTarget {
  /** TALLY_AMQP_URL: one node, or several of one cluster, tried in turn. */
  readonly url: string;
  /** `<queue>.dead` */
  readonly deadQueue: string;
  /** TALLY_MESSAGE_MAPPING: where a dead letter's id is read, as the daemon read it (null or absent: the contract's shape). */
  readonly messageMapping?: MessageMapping | null;
}

/** The first node of TALLY_AMQP_URL that answers; none answering is TALLY_AMQP_UNAVAILABLE (broker-connect.ts). */
async function connect(url: string, name: string): Promise<amqp.ChannelModel> {
  return (await connectAnyNode(url, `tally-cli-${name}-${process.pid}`)).model;
}

/** The message count of a queue; a missing queue is a clear error, not an empty list. */
async function messageCount(connection: amqp.ChannelModel, queue: string): Promise<number> {
  const probe = await connection.createChannel();
  probe.on('error', () => {});
  try {
    const { messageCount: count } = await probe.checkQueue(queue);
    await probe.close();
    return count;
  } catch (error) {
    throw new QueueMissingError(`queue ${JSON.stringify(queue)} does not exist (the daemon declares it on start; check TALLY_QUEUE)`, { cause: error });
  }
}

/** Counts every dead letter by reason and keeps the first `limit` matching ones; requeues all in order. */
export async function listDeadLetters(target: DeadQueueTarget, summary: DeadLetterSummary): Promise<DeadLetterSummary> {
  const connection = await connect(target.url, 'dead-list');
  try {
    const snapshot = await messageCount(connection, target.deadQueue);
    const channel = await connection.createChannel();
    let read = 0;
    for (; read < snapshot; read++) {
      const message = await channel.get(target.deadQueue, { noAck: false });
      if (message === false) break;
      summary.add(describeDeadLetter(message, read, target.messageMapping ?? null));
    }
    if (read > 0) channel.nackAll(true);
    await channel.close();
    return summary;
  } finally {
    await connection.close().catch(() => {});
  }
}

export interface ReplayOptions extends DeadQueueTarget {
  /** The work queue the daemon consumes (TALLY_QUEUE). */
  readonly queue: string;
  /** TALLY_PARTITIONS: above 1, each dead letter goes back to the partition queue it came from. */
  readonly partitions?: number;
  readonly reason: string | null;
  readonly limit: number;
  /** What may be replayed (replay-guard.ts); the time is read per message. Without it every matching dead letter is. */
  readonly policy?: Omit<ReplayPolicy, 'nowMs'> & { readonly now?: () => number };
  /** A count-refused letter's message: the standing counts Redis records for it (replay-guard.ts), or null. */
  readonly recordedStanding?: (id: string) => Promise<StandingCounts | null>;
  /** A forced replay's copy was confirmed: record it (the forced_replays counter) before the dead one is acked. */
  readonly onForced?: (entry: DeadLetterEntry) => Promise<void>;
  /** Test seam: runs after a copy is confirmed and before the dead one is acked. */
  readonly afterConfirm?: (entry: DeadLetterEntry) => void | Promise<void>;
}

export interface ReplayReport {
  readonly queue: string;
  readonly deadQueue: string;
  readonly replayed: number;
  readonly replayedByReason: Record<string, number>;
  /** Dead letters read and left in place (other reasons, refused, or beyond the limit). */
  readonly kept: number;
  readonly first: DeadLetterEntry[];
  /** Matching dead letters kept in place: they may have been counted and their markers may have expired. */
  readonly refused: RiskSummary;
  /** Such dead letters replayed anyway (--force). */
  readonly forced: RiskSummary;
  /** The marker lifetime the verdicts relied on, in seconds; null without a policy. */
  readonly markerLifeS: number | null;
  /** Partitioned queues: dead letters kept because they name no partition queue to return to (replay-target.ts). */
  readonly withoutPartition: number;
}

/**
 * The copy sent back: body and properties as they were, the reason moved to
 * `x-tally-replayed-reason`, the first dead-lettering time to
 * `x-tally-first-dead-at`.
 */
export function replayProperties(message: Pick<GetMessage, 'properties'>, reason: string): Options.Publish {
  const { properties } = message;
  const headers: Record<string, unknown> = { ...(properties.headers ?? {}) };
  delete headers[REASON_HEADER];
  delete headers[SOURCE_QUEUE_HEADER];
  // Replayed (forced): the operator has subtracted what stood. A copy refused again gets the daemon's own header anew.
  delete headers[STANDING_COUNTS_HEADER];
  headers['x-tally-replayed-reason'] = reason;
  // A copy dead-lettered again gets a time of its own, and keeps the first: what a replay finds already counted
  // (a count-refused message's other parts) writes no new marker, so their markers date from the first time
  // (replay-guard.ts firstDeadAt).
  const first = firstDeadAt(headers);
  delete headers[DEAD_AT_HEADER];
  delete headers[FIRST_DEAD_AT_HEADER];
  if (first !== null) headers[FIRST_DEAD_AT_HEADER] = first;
  return copyPublishOptions(properties, headers);
}

/**
 * Resolves once the broker confirmed the copy was routed to `queue`. With
 * `mandatory`, an unroutable copy comes back as basic.return before its
 * confirm: that is a failure here, never a silent drop.
 */
function publishConfirmed(channel: ConfirmChannel, queue: string, message: GetMessage, options: Options.Publish, returned: { flag: boolean }): Promise<void> {
  returned.flag = false;
  return new Promise((resolve, reject) => {
    channel.sendToQueue(queue, message.content, options, (error) => {
      if (error) reject(new ReplayRefusedError(`the broker refused the copy: ${String(error)}`));
      else if (returned.flag) reject(new ReplayRefusedError(`queue ${JSON.stringify(queue)} did not take the copy (unroutable)`));
      else resolve();
    });
  });
}

export async function replayDeadLetters(options: ReplayOptions): Promise<ReplayReport> {
  const connection = await connect(options.url, 'dead-replay');
  const summary = new DeadLetterSummary(options.reason, 20);
  const replayedByReason: Record<string, number> = {};
  const refused = new RiskSummary();
  const forced = new RiskSummary();
  const { policy } = options;
  const now = policy?.now ?? Date.now;
  let replayed = 0;
  let kept = 0;
  let withoutPartition = 0;
  try {
    const snapshot = await messageCount(connection, options.deadQueue);
    // The work queue must exist (a replay into nothing would be refused copy by copy); with partitions, the first one.
    await messageCount(connection, partitionQueue(options.queue, options.partitions ?? 1, 0));
    const channel = await connection.createConfirmChannel();
    const returned = { flag: false };
    channel.on('return', () => {
      returned.flag = true;
    });
    for (let position = 0; position < snapshot && replayed < options.limit; position++) {
      const message = await channel.get(options.deadQueue, { noAck: false });
      if (message === false) break;
      const entry = describeDeadLetter(message, position, options.messageMapping ?? policy?.messageMapping ?? null);
      summary.add(entry);
      if (!summary.matches(entry)) {
        kept++;
        continue;
      }
      const recorded = entry.reason === COUNT_REFUSED && entry.id !== null ? ((await options.recordedStanding?.(entry.id)) ?? null) : null;
      const verdict = policy === undefined ? null : replayVerdict(message, entry.reason, entry.detail, { ...policy, nowMs: now() }, recorded);
      if (verdict?.action === 'refuse') {
        refused.add(position, entry.id, entry.reason, verdict);
        kept++;
        continue;
      }
      const target = replayQueueOf(message.properties.headers, options.queue, options.partitions ?? 1);
      if (target === null) {
        withoutPartition++;
        kept++;
        continue;
      }
      await publishConfirmed(channel, target, message, replayProperties(message, entry.reason), returned);
      if (verdict?.action === 'force') {
        forced.add(position, entry.id, entry.reason, verdict);
        await options.onForced?.(entry);
      }
      await options.afterConfirm?.(entry);
      channel.ack(message);
      replayed++;
      replayedByReason[entry.reason] = (replayedByReason[entry.reason] ?? 0) + 1;
    }
    // The messages kept go back where they were, in one step.
    if (kept > 0) channel.nackAll(true);
    await channel.close();
    return {
      queue: options.queue,
      deadQueue: options.deadQueue,
      replayed,
      replayedByReason,
      kept,
      first: summary.messages,
      refused,
      forced,
      markerLifeS: policy?.markerLifeS ?? null,
      withoutPartition,
    };
  } finally {
    await connection.close().catch(() => {});
  }
}
