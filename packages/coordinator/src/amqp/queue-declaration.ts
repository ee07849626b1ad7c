/**
 * The queues Tally declares: the work queue and `<queue>.dead`, classic or
 * quorum (TALLY_QUEUE_TYPE). A queue that already exists with other
 * arguments (declared by an operator, or by an older Tally) is used as it is.
 *
 * A quorum work queue gets a delivery limit and at-least-once dead-lettering
 * to `<queue>.dead`: a message redelivered past the limit (a daemon that
 * crashes on it over and over, or a crash loop of the fleet) is moved by the
 * broker to `<queue>.dead` with `x-first-death-reason: delivery_limit`, and
 * at-least-once means the broker keeps it until `<queue>.dead` has confirmed
 * it. Without a dead-letter target a quorum queue past its limit drops the
 * message; at-most-once dead-lettering can drop it too. at-least-once needs
 * RabbitMQ 3.10 or later and `x-overflow: reject-publish` (with no length
 * limit set, that overflow never triggers).
 */
import type { ChannelModel } from 'amqplib';
import { CONSISTENT_HASH_EXCHANGE, describeError, PARTITION_WEIGHT, partitionQueues, TallyError, type QueueType } from '@tally/shared';
import { amqpReplyCode } from './broker-refusal.js';
import type { Logger } from '../process/logger.js';

export interface QueueDeclarationOptions {
  readonly queue: string;
  readonly deadLetterQueue: string;
  readonly queueType: QueueType;
  readonly deliveryLimit: number;
  /** TALLY_PARTITIONS; 1 (one queue named `queue`) when absent. */
  readonly partitions?: number;
}

export interface DeclaredQueue {
  readonly queue: string;
  /** True when this declaration created the queue or matched it exactly; false when an existing queue differs and is used as it is. */
  readonly asRequested: boolean;
  readonly requestedType: QueueType;
  /** The type found: the requested one when asRequested, else read from the broker's refusal when it names x-queue-type. */
  readonly type: QueueType | 'unknown';
  readonly arguments: Readonly<Record<string, unknown>>;
  /** The broker's refusal of the requested arguments, when the queue differs. */
  readonly brokerSays?: string;
}

/**
 * Arguments of the work queue. Classic queues carry none, exactly as Tally
 * always declared them, so existing classic deployments match.
 */
export function workQueueArguments(options: QueueDeclarationOptions): Record<string, unknown> {
  if (options.queueType === 'classic') return {};
  return {
    'x-queue-type': 'quorum',
    'x-delivery-limit': options.deliveryLimit,
    'x-dead-letter-exchange': '',
    'x-dead-letter-routing-key': options.deadLetterQueue,
    'x-dead-letter-strategy': 'at-least-once',
    'x-overflow': 'reject-publish',
  };
}

/**
 * Arguments of a partition queue (TALLY_PARTITIONS > 1): the work queue's,
 * plus single active consumer. That is the broker's guarantee behind
 * invariant 14: however many daemons subscribe to a partition (two that
 * briefly disagree on its owner, or the next owner during a handoff), only
 * one receives its deliveries; the others wait until it cancels (quorum) or
 * its channel closes (classic; measured on 3.10: a classic queue activates
 * the next consumer only when the active one's channel closes).
 */
export function partitionQueueArguments(options: QueueDeclarationOptions): Record<string, unknown> {
  return { ...workQueueArguments(options), 'x-single-active-consumer': true };
}

/** `<queue>.dead` is of the same type, replicated like the work queue when quorum, and dead-letters nothing itself. */
export function deadQueueArguments(options: QueueDeclarationOptions): Record<string, unknown> {
  return options.queueType === 'classic' ? {} : { 'x-queue-type': 'quorum' };
}

export interface ArgumentRefusal {
  readonly argument: string;
  /** The existing queue's value: undefined when it has none; null when its type cannot be reproduced here. */
  readonly current: string | number | undefined | null;
  /** True when the broker wrote the value without a type because it has the type of the one sent ("received '9' but current is '5'"). */
  readonly typeAsSent?: boolean;
}

/**
 * Reads a PRECONDITION_FAILED refusal: which argument differs and what the
 * existing queue has ("... inequivalent arg 'x-queue-type' ...: received the
 * value 'quorum' of type 'longstr' but current is none"). Null when the
 * refusal is about something else (durable, exclusive).
 */
export function parseArgumentRefusal(message: string): ArgumentRefusal | null {
  const match = /inequivalent arg '(x-[^']+)'.*but current is (none|the value '([^']*)' of type '([a-z]+)'|'([^']*)')/.exec(message);
  if (match === null) return null;
  const [, argument, , value, type, untyped] = match;
  if (untyped !== undefined) return { argument: argument!, current: untyped, typeAsSent: true };
  if (value === undefined) return { argument: argument!, current: undefined };
  if (type === 'longstr') return { argument: argument!, current: value };
  if (/^(signedint|long|short|byte|unsignedbyte|unsignedshort|unsignedint)$/.test(type!)) return { argument: argument!, current: Number(value) };
  return { argument: argument!, current: null };
}

/** Declares a queue on a channel of its own (a refusal closes the channel); the refusal's text, or null when it matched. */
async function tryDeclare(model: ChannelModel, queue: string, args: Record<string, unknown>): Promise<string | null> {
  const channel = await model.createChannel();
  channel.on('error', () => {});
  try {
    await channel.assertQueue(queue, { durable: true, arguments: args });
    await channel.close().catch(() => {});
    return null;
  } catch (error) {
    if (amqpReplyCode(error) !== 406 /* PRECONDITION_FAILED */) throw error;
    return describeError(error)
      .replace(/^.*with message "/, '')
      .replace(/"$/, '');
  }
}

/**
 * The type of a queue that exists with other arguments. AMQP has no query
 * for a queue's arguments, and a refusal names only the first argument that
 * differs, so this declares again with what each refusal says the queue has
 * (dropping what it lacks, taking what it holds), until the broker accepts
 * or names x-queue-type. Each attempt is equivalent to the queue or refused:
 * it never changes the queue. "unknown" when an argument cannot be copied.
 */
async function probeType(model: ChannelModel, queue: string, requested: Record<string, unknown>, firstRefusal: string): Promise<QueueType | 'unknown'> {
  const args = { ...requested };
  let refusal: string | null = firstRefusal;
  for (let attempt = 0; attempt < 16; attempt++) {
    if (refusal === null) break;
    const parsed = parseArgumentRefusal(refusal);
    if (parsed === null || parsed.current === null) return 'unknown';
    if (parsed.argument === 'x-queue-type') {
      const found = parsed.current ?? 'classic';
      return found === 'classic' || found === 'quorum' ? found : 'unknown';
    }
    if (parsed.current === undefined) delete args[parsed.argument];
    else if (parsed.typeAsSent && typeof args[parsed.argument] === 'number') args[parsed.argument] = Number(parsed.current);
    else args[parsed.argument] = parsed.current;
    refusal = await tryDeclare(model, queue, args);
  }
  if (refusal !== null) return 'unknown';
  const type = args['x-queue-type'] ?? 'classic';
  return type === 'classic' || type === 'quorum' ? type : 'unknown';
}

/** Declares one queue, or uses it as it is when it exists with other arguments. */
export async function declareQueue(model: ChannelModel, queue: string, requestedType: QueueType, args: Record<string, unknown>): Promise<DeclaredQueue> {
  const brokerSays = await tryDeclare(model, queue, args);
  if (brokerSays === null) return { queue, asRequested: true, requestedType, type: requestedType, arguments: args };
  // It exists: make sure it is there and usable (this throws if not), and use it as it is.
  const check = await model.createChannel();
  check.on('error', () => {});
  await check.checkQueue(queue);
  await check.close().catch(() => {});
  const type = await probeType(model, queue, args, brokerSays);
  return { queue, asRequested: false, requestedType, type, arguments: args, brokerSays };
}

/**
 * `<queue>.dead` first: the work queue's dead-lettering targets it. Logs what
 * was found; a quorum request met by a queue without a delivery limit is a
 * warning, since a crash loop then redelivers forever instead of parking the
 * message in `<queue>.dead`.
 */
export async function declareTallyQueues(model: ChannelModel, options: QueueDeclarationOptions, log: Logger): Promise<DeclaredQueue[]> {
  const dead = await declareQueue(model, options.deadLetterQueue, options.queueType, deadQueueArguments(options));
  const partitions = options.partitions ?? 1;
  const work =
    partitions === 1
      ? [await declareQueue(model, options.queue, options.queueType, workQueueArguments(options))]
      : await declarePartitions(model, options, partitions);
  for (const declared of [dead, ...work]) {
    if (declared.asRequested) {
      log.info({ queue: declared.queue, type: declared.type, arguments: declared.arguments }, 'queue declared');
    } else {
      log.warn(
        { queue: declared.queue, requested: declared.requestedType, found: declared.type, brokerSays: declared.brokerSays },
        'queue exists with other arguments; using it as it is (TALLY_QUEUE_TYPE and TALLY_DELIVERY_LIMIT do not apply to it)',
      );
    }
  }
  return [...work, dead];
}

/**
 * TALLY_PARTITIONS > 1: the exchange `<queue>` of type x-consistent-hash
 * (durable), and `<queue>.0` … `<queue>.<N-1>`, each bound to it with the
 * same weight. A binding that exists already is the same binding (queue,
 * exchange, key): declaring it again changes nothing, so every daemon
 * declares the whole set at each connect. A missing plugin fails the
 * exchange declaration with COMMAND_INVALID (broker-refusal.ts names it).
 */
async function declarePartitions(model: ChannelModel, options: QueueDeclarationOptions, partitions: number): Promise<DeclaredQueue[]> {
  const channel = await model.createChannel();
  channel.on('error', () => {});
  try {
    await channel.assertExchange(options.queue, CONSISTENT_HASH_EXCHANGE, { durable: true });
  } finally {
    await channel.close().catch(() => {});
  }
  const declared: DeclaredQueue[] = [];
  const binder = await model.createChannel();
  binder.on('error', () => {});
  try {
    for (const queue of partitionQueues(options.queue, partitions)) {
      declared.push(await declareQueue(model, queue, options.queueType, partitionQueueArguments(options)));
      await binder.bindQueue(queue, options.queue, PARTITION_WEIGHT);
    }
  } finally {
    await binder.close().catch(() => {});
  }
  return declared;
}

/** The options of a stream source's declarations (TALLY_SOURCE=stream). */
export interface StreamDeclarationOptions {
  readonly queue: string;
  readonly deadLetterQueue: string;
  /** TALLY_PARTITIONS: 1, one stream named `queue`; N > 1, streams `<queue>.<p>` behind the consistent-hash exchange `queue`. */
  readonly partitions: number;
}

/** A queue of the stream source's name exists and is not a stream: counting from it by offset is impossible. */
export class NotAStreamError extends TallyError {
  constructor(queue: string, found: string) {
    super(
      'TALLY_AMQP_REFUSED',
      `${queue} exists as a ${found} queue, and TALLY_SOURCE=stream needs a stream there (x-queue-type: stream); ` +
        `drain and delete it, or use another TALLY_QUEUE for the streams`,
    );
  }
}

/**
 * TALLY_SOURCE=stream: `<queue>.dead` (a classic queue: dead letters are
 * few and replayed by `tally dead replay`), then the stream(s), and with
 * partitions the exchange and its bindings. A stream that exists is used as
 * the operator declared it (retention: x-max-age, x-max-length-bytes); one
 * Tally creates gets no retention (it keeps everything until a policy or an
 * operator sets one: docs/streams.md says what to set), which is logged.
 */
export async function declareTallyStreams(model: ChannelModel, options: StreamDeclarationOptions, log: Logger): Promise<void> {
  const dead = await declareQueue(model, options.deadLetterQueue, 'classic', {});
  if (!dead.asRequested)
    log.warn({ queue: dead.queue, found: dead.type, brokerSays: dead.brokerSays }, 'dead-letter queue exists with other arguments; using it as it is');
  const streams = options.partitions === 1 ? [options.queue] : partitionQueues(options.queue, options.partitions);
  if (options.partitions > 1) {
    const channel = await model.createChannel();
    channel.on('error', () => {});
    try {
      await channel.assertExchange(options.queue, CONSISTENT_HASH_EXCHANGE, { durable: true });
    } finally {
      await channel.close().catch(() => {});
    }
  }
  const binder = options.partitions > 1 ? await model.createChannel() : null;
  binder?.on('error', () => {});
  try {
    for (const stream of streams) {
      const brokerSays = await tryDeclare(model, stream, { 'x-queue-type': 'stream' });
      if (brokerSays === null)
        log.info({ stream }, 'stream ready (declared now, or found without retention arguments: it keeps every message until a policy says otherwise)');
      else {
        const refusal = parseArgumentRefusal(brokerSays);
        if (refusal?.argument === 'x-queue-type') throw new NotAStreamError(stream, String(refusal.current ?? 'classic'));
        log.info({ stream, brokerSays }, 'stream exists with arguments of its own (retention); using it as it is');
      }
      if (binder !== null) await binder.bindQueue(stream, options.queue, PARTITION_WEIGHT);
    }
  } finally {
    await binder?.close().catch(() => {});
  }
}
