/**
 * What `tally dead list` and `tally dead replay` say about the dead-letter
 * queue, computed from the messages as they are read. Pure: no broker here.
 * Every body and header is hostile: nothing is trusted to be a string, a
 * size, or valid JSON, and nothing from a body is printed beyond its id.
 */
import {
  BROKER_DEAD_REASONS,
  CliUsageError,
  deadLetterReason,
  mappedIdValue,
  MESSAGE_LIMITS,
  standingCountsOf,
  TALLY_DEAD_REASONS,
  type MessageMapping,
  type StandingCounts,
} from '@tally/shared';

/** The header the daemon writes: `<code>: <detail>`. */
export const REASON_HEADER = 'x-tally-reason';
/** A dead letter with no readable reason (not written by Tally, or tampered with). */
export const UNKNOWN_REASON = 'unknown';
/** Bodies larger than this are not parsed for an id (the messageId property still counts). */
const MAX_BODY_PARSED_FOR_ID = 1_048_576;

export interface DeadLetterView {
  readonly content: Buffer;
  readonly properties: { readonly messageId?: unknown; readonly headers?: Record<string, unknown> | undefined };
}

export interface DeadLetterEntry {
  /** 0-based position in the dead-letter queue when it was read. */
  readonly position: number;
  /** The id the daemon would have used, or null when there is none to read. */
  readonly id: string | null;
  readonly reason: string;
  readonly detail: string;
  readonly bytes: number;
  /** Counts of it that stand on another count shard (STANDING_COUNTS_HEADER), to subtract before a replay; absent when none. */
  readonly standing?: StandingCounts | 'unreadable';
}

function text(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (Buffer.isBuffer(value)) return value.toString('utf8');
  return undefined;
}

/** Every reason code a dead letter can be listed or replayed by: Tally's and the broker's (x-death). */
export const DEAD_REASON_CODES: readonly string[] = Object.freeze([...TALLY_DEAD_REASONS, ...Object.values(BROKER_DEAD_REASONS)]);

/**
 * The reason code and detail of the `x-tally-reason` header; without one,
 * the broker's reason (x-first-death-reason: delivery-limit, rejected,
 * expired, maxlen); `unknown` when neither is there or readable.
 */
export function reasonOf(headers: Record<string, unknown> | undefined): { reason: string; detail: string } {
  const header = text(headers?.[REASON_HEADER]);
  if (header === undefined) {
    const broker = deadLetterReason(headers);
    return broker.source === 'broker' ? { reason: broker.code, detail: broker.detail.slice(0, 200) } : { reason: UNKNOWN_REASON, detail: '' };
  }
  const colon = header.indexOf(':');
  const code = (colon < 0 ? header : header.slice(0, colon)).trim();
  const detail =
    colon < 0
      ? ''
      : header
          .slice(colon + 1)
          .trim()
          .slice(0, 200);
  return TALLY_DEAD_REASONS.includes(code) ? { reason: code, detail } : { reason: UNKNOWN_REASON, detail: header.slice(0, 200) };
}

/**
 * The id the daemon would have read, at most the id length limit: through
 * TALLY_MESSAGE_MAPPING's id sources when one is declared (a body path, the
 * messageId property, a header), else the body's `id` when it is a JSON
 * object with a string id, else the messageId property.
 */
export function idOf(message: DeadLetterView, mapping: MessageMapping | null = null): string | null {
  let root: unknown = undefined;
  if (message.content.byteLength > 0 && message.content.byteLength <= MAX_BODY_PARSED_FOR_ID) {
    try {
      root = JSON.parse(message.content.toString('utf8'));
    } catch {
      // Not JSON: the property or a header may still name it.
    }
  }
  let id: string | undefined;
  if (mapping !== null) {
    const value = mappedIdValue(root, message.properties, mapping);
    id = text(value) ?? (typeof value === 'number' ? String(value) : undefined);
  } else {
    if (root !== null && typeof root === 'object' && !Array.isArray(root) && typeof (root as { id?: unknown }).id === 'string') {
      id = (root as { id: string }).id;
    }
    id ??= text(message.properties.messageId);
  }
  if (id === undefined || id === '') return null;
  return id.length > MESSAGE_LIMITS.maxIdLength ? `${id.slice(0, MESSAGE_LIMITS.maxIdLength)}…` : id;
}

export function describeDeadLetter(message: DeadLetterView, position: number, mapping: MessageMapping | null = null): DeadLetterEntry {
  const { reason, detail } = reasonOf(message.properties.headers);
  // The daemon's word on count-refused letters only (replay-guard.ts).
  const standing = standingCountsOf(reason, message.properties.headers);
  return { position, id: idOf(message, mapping), reason, detail, bytes: message.content.byteLength, ...(standing === null ? {} : { standing }) };
}

/** `--reason CODE`: one of the stable reason codes (Tally's or the broker's), or `unknown`. */
export function parseReasonFlag(raw: string | undefined): string | null {
  if (raw === undefined) return null;
  if (raw === UNKNOWN_REASON || DEAD_REASON_CODES.includes(raw)) return raw;
  throw new CliUsageError(`--reason: expected one of ${[...DEAD_REASON_CODES, UNKNOWN_REASON].join(', ')}, got ${JSON.stringify(raw)}`);
}

/** `--limit N`: a positive integer, or the fallback. */
export function parseLimitFlag(raw: string | undefined, fallback: number): number {
  if (raw === undefined) return fallback;
  if (!/^\d+$/.test(raw) || Number(raw) < 1 || !Number.isSafeInteger(Number(raw))) {
    throw new CliUsageError(`--limit: expected a positive integer, got ${JSON.stringify(raw)}`);
  }
  return Number(raw);
}

/** Counts by reason over every message read, and the first `limit` messages that match the filter. */
export class DeadLetterSummary {
  total = 0;
  matching = 0;
  readonly byReason: Record<string, number> = {};
  readonly messages: DeadLetterEntry[] = [];

  constructor(
    private readonly reason: string | null,
    private readonly limit: number,
  ) {}

  matches(entry: DeadLetterEntry): boolean {
    return this.reason === null || entry.reason === this.reason;
  }

  add(entry: DeadLetterEntry): void {
    this.total++;
    this.byReason[entry.reason] = (this.byReason[entry.reason] ?? 0) + 1;
    if (!this.matches(entry)) return;
    this.matching++;
    if (this.messages.length < this.limit) this.messages.push(entry);
  }
}
