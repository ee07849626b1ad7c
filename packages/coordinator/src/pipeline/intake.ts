/**
 * Where a delivery enters: recorded for its ack, parsed, dead-lettered when
 * bad (invariants 5 and 6), split into one part per virtual shard, held
 * behind an earlier copy of its id still in flight (in-flight.ts), or handed
 * to the shard lanes.
 */
import type { ConsumeMessage } from 'amqplib';
import {
  formatReason,
  markerDigestText,
  markerShardOf,
  deliveryParser,
  ShardSplit,
  splitInto,
  wholeMessageInto,
  type DeliveryParser,
  type InjectedBug,
  type MarkerScope,
  type TallyConfig,
} from '@tally/shared';
import type { StreamCursor } from '../stream/stream-cursor.js';
import type { ChannelLink, Delivery } from './delivery.js';
import type { PendingPart } from './shard-lanes.js';
import { timestampToMs } from '../telemetry/metrics.js';
import type { AckWindow } from './ack-window.js';
import type { DeadLetters } from './dead-letters.js';
import type { InFlightMessages } from './in-flight.js';
import type { Clock, Counters } from './ports.js';

export type IntakeOptions = Pick<TallyConfig, 'virtualShards' | 'acceptTypes' | 'maxMessageBytes' | 'prefetch'> &
  Partial<Pick<TallyConfig, 'messageMapping' | 'source'>> & {
    /**
     * What one marker stands for, as the prefix's layout records it (not as
     * TALLY_MARKER_SCOPE asks: every daemon of a prefix must split alike).
     * `part`: one part per virtual shard of the SKUs; `message`: the whole
     * message as one part, on its digest's marker shard.
     */
    readonly recordedMarkerScope: MarkerScope;
    /** TALLY_FAULT_BUG=main (config.ts loadFaultInjection): each delivery makes the ack tracker throw. */
    readonly injectBug?: InjectedBug | null;
  };

/** The lanes as intake uses them (shard-lanes.ts). */
export interface LaneEntry {
  add(vshard: number, part: PendingPart): void;
  flushAll(): void;
}

/** Where an admitted delivery goes, and what it reports to. */
export interface IntakeDeps {
  readonly acks: AckWindow;
  readonly counters: Counters;
  readonly deadLetters: DeadLetters;
  readonly inFlight: InFlightMessages;
  readonly lanes: LaneEntry;
  readonly clock: Clock;
}

export class Intake {
  /** The contract's shape, or TALLY_MESSAGE_MAPPING's (null or absent: the contract's): chosen once, at start. */
  private readonly parseDelivery: DeliveryParser;
  /** Reused by every delivery: its parts go to the lanes before the next one is split. */
  private readonly split = new ShardSplit();

  private readonly acks: AckWindow;
  private readonly counters: Counters;
  private readonly deadLetters: DeadLetters;
  private readonly inFlight: InFlightMessages;
  private readonly lanes: LaneEntry;
  private readonly clock: Clock;

  constructor(
    private readonly options: IntakeOptions,
    deps: IntakeDeps,
  ) {
    ({ acks: this.acks, counters: this.counters, deadLetters: this.deadLetters, inFlight: this.inFlight, lanes: this.lanes, clock: this.clock } = deps);
    this.parseDelivery = deliveryParser(options.messageMapping ?? null, Object.freeze({ maxBytes: options.maxMessageBytes }));
  }

  accept(channel: ChannelLink, message: ConsumeMessage): void {
    const tag = message.fields.deliveryTag;
    const { counters, options } = this;
    if (!this.acks.received(channel, tag)) return; // a late delivery from a dead channel: it will be redelivered
    if (options.injectBug === 'main') this.acks.received(channel, tag); // fault injection: a tag out of sequence
    const cursor = channel.stream;
    let offset = 0;
    if (cursor !== undefined) {
      offset = streamOffsetOf(message);
      const verdict = cursor.classify(offset, message.content);
      if (verdict !== 'count') {
        if (verdict === 'window') this.readIntoWindow(cursor, message, offset);
        this.acks.finish(channel, tag);
        return;
      }
    }
    counters.add('received');

    const parsed = this.parseDelivery(message.content, message.properties);
    if (!parsed.ok) {
      this.deadLetters.send(channel, message, parsed.reason, formatReason(parsed.reason, parsed.detail), message.properties.headers?.traceparent);
      return;
    }
    const digest = markerDigestText(parsed.message.id);
    // A producer's duplicate: the same id earlier in this partition's log, within the window (TALLY_STREAM_DEDUP).
    if (cursor?.window != null && cursor.window.admit(digest, offset, this.clock.epochMs()) === 'duplicate') {
      counters.add('duplicates');
      this.acks.finish(channel, tag);
      return;
    }
    // With message scope (a standalone Redis) a message is one part on its digest's shard, whose watermark covers it
    // (a stream) or whose marker does (a queue); its changes still go to their SKUs' own count keys.
    const parts =
      options.recordedMarkerScope === 'message'
        ? wholeMessageInto(this.split, parsed.message.changes, markerShardOf(digest, options.virtualShards), options.acceptTypes)
        : splitInto(this.split, parsed.message.changes, options.virtualShards, options.acceptTypes);
    if (parts.size === 0) {
      counters.add('empty');
      this.acks.finish(channel, tag);
      return;
    }
    const delivery: Delivery = {
      tag,
      link: channel,
      id: parsed.message.id,
      digest,
      redelivered: message.fields.redelivered,
      remaining: parts.size,
      parts: parts.size,
      markedParts: 0,
      waiters: null,
      receivedAt: this.clock.now(),
      publishedAt: timestampToMs(message.properties.timestamp),
      traceparent: message.properties.headers?.traceparent,
      message,
      refusal: null,
      ...(cursor === undefined ? {} : { position: { partition: cursor.partition, offset } }),
    };
    // Invariant 4: a copy of an id already in flight waits for the first and is settled as a duplicate with it.
    if (this.inFlight.admit(delivery)) for (let i = 0; i < parts.size; i++) this.lanes.add(parts.shards[i]!, { delivery, changes: parts.parts[i]! });
    // Prefetch credit exhausted: nothing more arrives until something is
    // acked, so waiting out the batch timers would only add latency.
    // Counted as the broker counts: finished deliveries that wait for an
    // earlier one to finish still hold credit until the multiple-ack.
    // Per channel: each partition's channel has its own credit (TALLY_PREFETCH each).
    if (this.acks.unackedOn(channel) >= options.prefetch) this.lanes.flushAll();
  }

  /** A message before the offset counting resumes from: its id joins the window (its bad or id-less siblings were dead-lettered when first read). */
  private readIntoWindow(cursor: StreamCursor, message: ConsumeMessage, offset: number): void {
    if (cursor.window === null) return;
    const parsed = this.parseDelivery(message.content, message.properties);
    if (parsed.ok) cursor.window.admit(markerDigestText(parsed.message.id), offset, this.clock.epochMs());
  }
}

/** The offset RabbitMQ gives every delivery from a stream; a stream delivery without one is a broker we do not understand: a bug to stop on. */
export function streamOffsetOf(message: ConsumeMessage): number {
  const offset: unknown = message.properties.headers?.['x-stream-offset'];
  if (typeof offset !== 'number' || !Number.isSafeInteger(offset) || offset < 0)
    throw new TypeError(`a stream delivery without a valid x-stream-offset header: ${JSON.stringify(offset)}`);
  return offset;
}
