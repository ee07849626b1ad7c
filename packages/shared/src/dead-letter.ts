/**
 * Why a message is in `<queue>.dead`. Two writers put messages there:
 *
 * - Tally, for a bad message: header `x-tally-reason: "<code>: <detail>"`
 *   (codes: BAD_MESSAGE_REASONS), or for a good message Redis refused to
 *   count: `count-refused: <Redis error> (sku, key, delta)` (COUNT_REFUSED);
 * - the broker, for a quorum queue's message redelivered past
 *   `x-delivery-limit` (a crash loop), or rejected, expired or over a length
 *   limit: headers `x-death` and `x-first-death-reason`, which Tally maps to
 *   the codes below.
 */
import { BAD_MESSAGE_REASONS } from './message.js';

/**
 * The reason code of a message Redis refused to count part of (a foreign
 * value in a count key, a 64-bit overflow). Unlike the
 * BAD_MESSAGE_REASONS the message is good: replay it once the key is
 * repaired (`tally dead replay --reason count-refused`).
 */
export const COUNT_REFUSED = 'count-refused';

/**
 * When Tally dead-lettered a message (ms since the epoch, the daemon's
 * clock), set on the copy it publishes to `<queue>.dead`. `tally dead
 * replay` reads it to tell whether the markers of what was counted of the
 * message (a `count-refused` message's other parts) may have expired.
 */
export const DEAD_AT_HEADER = 'x-tally-dead-at';

/**
 * The earliest DEAD_AT_HEADER of a message dead-lettered more than once (ms
 * since the epoch). `tally dead replay` moves the time of the dead letter it
 * replays here, and the daemon keeps every header of a message it
 * dead-letters, so the copy of a replay that fails again still carries it.
 * A `count-refused` message replayed before its key was repaired finds its
 * other parts' markers and writes none: they still date from the first
 * dead-lettering, and the replay guard must reckon from that one.
 */
export const FIRST_DEAD_AT_HEADER = 'x-tally-first-dead-at';

/**
 * On a `count-refused` dead letter (message-scoped markers on a Redis
 * Cluster): the message's increments on other count shards that Redis
 * refused to undo, so they stand in the counts. A JSON object, count key ->
 * the delta that stands (a decimal string). A replay would count them a
 * second time: `tally dead replay` keeps such a dead letter back, at any
 * age, until the operator has subtracted each delta and replays it with
 * --force (replay-guard.ts).
 */
export const STANDING_COUNTS_HEADER = 'x-tally-standing-counts';

/** Count key -> the delta that stands (a decimal string). */
export type StandingCounts = Readonly<Record<string, string>>;

/**
 * The standing counts a dead letter's headers name: null when it has none;
 * 'unreadable' when the header is there but is not such an object (a
 * replay must then assume the worst). Never throws on hostile headers.
 */
export function standingCountsOf(reason: string, headers: Readonly<Record<string, unknown>> | undefined): StandingCounts | null | 'unreadable' {
  // Only the daemon writes it, and only on count-refused letters (it drops a producer's copy); a broker's letter keeps
  // the producer's headers, so there it is no one's word.
  if (reason !== COUNT_REFUSED) return null;
  const raw = headers?.[STANDING_COUNTS_HEADER];
  if (raw === undefined || raw === null) return null;
  const text = Buffer.isBuffer(raw) ? raw.toString('utf8') : raw;
  if (typeof text !== 'string') return 'unreadable';
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return 'unreadable';
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) return 'unreadable';
  return wellFormedStanding(parsed as Record<string, unknown>) ?? 'unreadable';
}

/** Standing counts as recorded in Redis (keys.ts standingKey): null when there are none or they are not well formed. */
export function standingCountsOfRecord(fields: Readonly<Record<string, unknown>>): StandingCounts | null {
  return wellFormedStanding(fields);
}

function wellFormedStanding(fields: Readonly<Record<string, unknown>>): StandingCounts | null {
  const entries = Object.entries(fields);
  // Keys are printed in a command for the operator to run: printable ASCII without spaces or quotes, like Tally's count keys.
  const wellFormed = ([key, delta]: [string, unknown]): boolean =>
    /^[\x21\x23-\x7e]{1,1024}$/.test(key) && typeof delta === 'string' && /^-?\d{1,20}$/.test(delta);
  if (entries.length === 0 || !entries.every(wellFormed)) return null;
  return Object.fromEntries(entries) as Record<string, string>;
}

/** Every code Tally itself writes in `x-tally-reason`. */
export const TALLY_DEAD_REASONS: readonly string[] = Object.freeze([...BAD_MESSAGE_REASONS, COUNT_REFUSED]);

export const BROKER_DEAD_REASONS = Object.freeze({
  delivery_limit: 'delivery-limit',
  rejected: 'rejected',
  expired: 'expired',
  maxlen: 'maxlen',
} as const);

export type BrokerDeadReason = (typeof BROKER_DEAD_REASONS)[keyof typeof BROKER_DEAD_REASONS];

export interface DeadLetterReason {
  /** A TALLY_DEAD_REASONS code, a BrokerDeadReason, or 'unknown'. */
  readonly code: string;
  readonly detail: string;
  readonly source: 'tally' | 'broker' | 'unknown';
}

/** Classifies a dead-lettered message by its headers; never throws on hostile headers. */
export function deadLetterReason(headers: Readonly<Record<string, unknown>> | undefined): DeadLetterReason {
  const tally = headers?.['x-tally-reason'];
  const text = Buffer.isBuffer(tally) ? tally.toString('utf8') : tally;
  if (typeof text === 'string' && text !== '') {
    const colon = text.indexOf(':');
    return { code: (colon < 0 ? text : text.slice(0, colon)).trim(), detail: colon < 0 ? '' : text.slice(colon + 1).trim(), source: 'tally' };
  }
  const raw = headers?.['x-first-death-reason'];
  const broker = Buffer.isBuffer(raw) ? raw.toString('utf8') : raw;
  if (typeof broker === 'string' && Object.hasOwn(BROKER_DEAD_REASONS, broker)) {
    const queue = headers?.['x-first-death-queue'];
    const from = typeof queue === 'string' ? ` by queue ${queue}` : Buffer.isBuffer(queue) ? ` by queue ${queue.toString('utf8')}` : '';
    return {
      code: BROKER_DEAD_REASONS[broker as keyof typeof BROKER_DEAD_REASONS],
      detail: `dead-lettered by the broker (${broker})${from}`,
      source: 'broker',
    };
  }
  return { code: 'unknown', detail: '', source: 'unknown' };
}
