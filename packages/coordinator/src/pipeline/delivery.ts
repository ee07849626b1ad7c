/**
 * One delivery from parse to ack, tied to the channel it came on.
 */
import type { Channel, ConsumeMessage } from 'amqplib';
import type { DigestText } from '@tally/shared';
import type { StreamCursor } from '../stream/stream-cursor.js';

/**
 * One delivery from the moment it is parsed until it is acked. A delivery
 * belongs to the channel it arrived on (`link`): after a reconnect its tag
 * means nothing on the new channel, so it is never acked there.
 */
export interface Delivery {
  readonly tag: number;
  readonly link: ChannelLink;
  readonly id: string;
  /** The marker digest of the id (markers.ts DigestText): computed once here, not once per part in the threads. */
  readonly digest: DigestText;
  readonly redelivered: boolean;
  /** Parts not yet reported done. */
  remaining: number;
  readonly parts: number;
  /** Parts whose marker was already occupied. */
  markedParts: number;
  /** Other deliveries with the same id that arrived while this one was in flight; null until one does (most never have one). */
  waiters: Delivery[] | null;
  /** performance.now() at delivery, for the process-duration histogram. */
  readonly receivedAt: number;
  /** Epoch ms of the message's timestamp property, when it has one. */
  readonly publishedAt: number | undefined;
  /** The producer's W3C traceparent header, unvalidated (checked when a span links to it). */
  readonly traceparent: unknown;
  /** The delivery as received: dead-lettered as it is if Redis refuses to count one of its parts. */
  readonly message: ConsumeMessage;
  /**
   * Set when Redis refused to count one of its parts (`x-tally-reason` detail:
   * the error, SKU, key and delta). That part counted nothing and has no
   * marker; the other parts are counted and marked as usual. Once every part
   * is done the delivery goes to the dead-letter queue (`count-refused`)
   * instead of being acked, and its replay counts only the refused part.
   */
  refusal: string | null;
  /**
   * Message-scoped markers on a Redis Cluster: increments of its refused
   * parts on other count shards that Redis refused to undo (count key ->
   * delta). Its dead letter carries them (STANDING_COUNTS_HEADER) so that
   * the replay guard keeps it back until they are subtracted.
   */
  standing?: Record<string, string>;
  /** Stream source: where the message sits in its partition's log; absent for a queue. */
  readonly position?: { readonly partition: number; readonly offset: number };
}

/** A channel generation: deliveries remember which one they came from. */
export interface ChannelLink {
  readonly generation: number;
  readonly channel: Channel;
  alive: boolean;
  /**
   * The partition this channel consumes (TALLY_PARTITIONS > 1: one channel
   * per partition, so delivery tags, acks and stalls are per partition);
   * absent with one queue.
   */
  readonly partition?: number;
  /** Stream source: what this subscription counts, reads into the id window only, or skips (stream-cursor.ts); absent for a queue. */
  readonly stream?: StreamCursor;
}
