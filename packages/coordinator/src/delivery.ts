import type { Channel } from 'amqplib';

/**
 * One delivery from the moment it is parsed until it is acked. A delivery
 * belongs to the channel it arrived on (`link`): after a reconnect its tag
 * means nothing on the new channel, so it is never acked there.
 */
export interface Delivery {
  readonly tag: number;
  readonly link: ChannelLink;
  readonly id: string;
  /** The marker digest of the id (markers.ts): computed once here, not once per part in the threads. */
  readonly digest: Uint8Array;
  readonly redelivered: boolean;
  /** Parts not yet reported done. */
  remaining: number;
  readonly parts: number;
  /** Parts whose marker was already occupied. */
  markedParts: number;
  /** Other deliveries with the same id that arrived while this one was in flight. */
  readonly waiters: Delivery[];
  /** performance.now() at delivery, for the process-duration histogram. */
  readonly receivedAt: number;
  /** Epoch ms of the message's timestamp property, when it has one. */
  readonly publishedAt: number | undefined;
  /** The producer's W3C traceparent header, unvalidated (checked when a span links to it). */
  readonly traceparent: unknown;
}

/** A channel generation: deliveries remember which one they came from. */
export interface ChannelLink {
  readonly generation: number;
  readonly channel: Channel;
  alive: boolean;
}
