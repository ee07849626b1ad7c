/**
 * Parsing and validation of one delivery body. Every body is hostile: this
 * module never throws, it returns either a message or a reason code plus a
 * detail saying what was wrong and where. The reason goes to the dead-letter
 * queue in `x-tally-reason`.
 *
 * It runs on the coordinator's main thread for every delivery, so the
 * common case is kept cheap without weakening a check:
 * - the usual body is read without JSON.parse (message-common-form.ts);
 * - any other body takes the general path, where the text is decoded by
 *   Buffer (decodeUtf8);
 * - the lone-surrogate check only runs when the text has an escape;
 * - per-SKU sums are only tracked once the total could overflow.
 */
import { isUtf8 } from 'node:buffer';
import { LONE_SURROGATE, readCommonForm } from './message-common-form.js';

export interface Change {
  readonly sku: string;
  readonly delta: number;
  readonly type?: string;
}

export interface InventoryMessage {
  readonly id: string;
  readonly changes: readonly Change[];
}

/** Stable reason codes; the README lists them. */
export const BAD_MESSAGE_REASONS = [
  'empty-body',
  'oversized-body',
  'invalid-utf8',
  'malformed-json',
  'not-an-object',
  'missing-id',
  'invalid-id',
  'missing-changes',
  'changes-not-array',
  'too-many-changes',
  'invalid-change',
  'invalid-sku',
  'invalid-delta',
  'unsafe-delta',
  'invalid-type',
] as const;
export type BadMessageReason = (typeof BAD_MESSAGE_REASONS)[number];

export type ParseResult =
  { readonly ok: true; readonly message: InventoryMessage } | { readonly ok: false; readonly reason: BadMessageReason; readonly detail: string };

export const MESSAGE_LIMITS = Object.freeze({
  maxIdLength: 256,
  maxSkuLength: 256,
  maxTypeLength: 64,
  maxChanges: 10_000,
});

export interface ParseOptions {
  /** Bodies larger than this are rejected before they are decoded. */
  readonly maxBytes: number;
}

/** The body as a Buffer (amqplib's already is), without copying. */
function asBuffer(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/** A UTF-8 byte order mark: skipped, as a WHATWG decoder does (and JSON.parse would refuse U+FEFF). */
const BOM = [0xef, 0xbb, 0xbf] as const;

/**
 * The body as text, or null when it is not valid UTF-8. `isUtf8` rejects what
 * a fatal WHATWG decoder rejects (overlong forms, encoded surrogates,
 * truncated sequences, code points past U+10FFFF), and Buffer's decoder gives
 * V8 a one-byte string for ASCII text, which JSON.parse reads about a third
 * faster than the two-byte string TextDecoder returns (docs/benchmark.md).
 */
function decodeUtf8(body: Uint8Array): string | null {
  const bytes = asBuffer(body);
  const start = bytes.length >= 3 && bytes[0] === BOM[0] && bytes[1] === BOM[1] && bytes[2] === BOM[2] ? 3 : 0;
  if (!isUtf8(bytes)) return null;
  return bytes.toString('utf8', start);
}

function bad(reason: BadMessageReason, detail: string): ParseResult {
  return { ok: false, reason, detail };
}

/** Short, log-safe rendering of a hostile value for a detail string. */
function show(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'string') {
    return value.length > 40 ? `a string of length ${value.length}` : JSON.stringify(value);
  }
  if (typeof value === 'object') return 'an object';
  if (typeof value === 'number') return String(value);
  return typeof value;
}

/**
 * @param mayHaveLoneSurrogates false when `value` comes from a body without
 * a backslash: valid UTF-8 decodes to paired surrogates only, so a lone one
 * can only come from a `\ud800` escape in the JSON.
 */
function checkId(value: unknown, where: string, mayHaveLoneSurrogates: boolean): ParseResult | string {
  if (typeof value !== 'string') return bad('invalid-id', `${where} must be a string, got ${show(value)}`);
  if (value.length === 0) return bad('invalid-id', `${where} must not be empty`);
  if (value.length > MESSAGE_LIMITS.maxIdLength) {
    return bad('invalid-id', `${where} is ${value.length} characters, the limit is ${MESSAGE_LIMITS.maxIdLength}`);
  }
  // A lone surrogate ("\ud800" in the JSON) has no UTF-8 form: Redis would
  // get U+FFFD instead, and two different ids would share one marker, the
  // second skipped as a duplicate of the first: a silent loss.
  if (mayHaveLoneSurrogates && LONE_SURROGATE.test(value)) return bad('invalid-id', `${where} contains a lone surrogate (not representable in UTF-8)`);
  return value;
}

/** Where change i is, for a detail string: built only when something is wrong there. */
function changeAt(i: number): string {
  return `changes[${i}]`;
}

/**
 * @param body the raw delivery body
 * @param messageIdProperty the AMQP `messageId` property, used when the body has no `id`
 */
export function parseMessage(body: Uint8Array, messageIdProperty: unknown, options: ParseOptions): ParseResult {
  if (body.byteLength === 0) return bad('empty-body', 'the body is empty');
  if (body.byteLength > options.maxBytes) {
    return bad('oversized-body', `the body is ${body.byteLength} bytes, the limit is ${options.maxBytes}`);
  }
  // The usual body, read without JSON.parse; anything else (or anything wrong) takes the general path.
  const common = readCommonForm(asBuffer(body), MESSAGE_LIMITS, messageIdProperty);
  if (common !== null) return { ok: true, message: common };
  return parseGeneral(body, messageIdProperty);
}

/**
 * The general path alone: JSON.parse, then every check in order. It decides
 * every body that is not in the common form, and its result is what
 * parseMessage must return for any body; exported for the test that holds
 * the two to that. The size checks have already been made.
 */
export function parseGeneral(body: Uint8Array, messageIdProperty: unknown): ParseResult {
  const text = decodeUtf8(body);
  if (text === null) return bad('invalid-utf8', 'the body is not valid UTF-8');
  let root: unknown;
  try {
    root = JSON.parse(text);
  } catch (error) {
    // V8's message names the position ("at position 17"), which is the "where".
    const why = error instanceof Error ? error.message.slice(0, 160) : 'unparseable';
    return bad('malformed-json', why);
  }
  if (root === null || typeof root !== 'object' || Array.isArray(root)) {
    return bad('not-an-object', `the body must be a JSON object, got ${show(root)}`);
  }
  const record = root as Record<string, unknown>;
  const escaped = text.includes('\\');

  let id: string;
  if (Object.hasOwn(record, 'id')) {
    const checked = checkId(record.id, 'id', escaped);
    if (typeof checked !== 'string') return checked;
    id = checked;
  } else if (messageIdProperty !== undefined && messageIdProperty !== null && messageIdProperty !== '') {
    // Not from the body: any string may hold a lone surrogate.
    const checked = checkId(messageIdProperty, 'the messageId property', true);
    if (typeof checked !== 'string') return checked;
    id = checked;
  } else {
    return bad('missing-id', 'no "id" field and no messageId property: the message cannot be deduplicated');
  }

  if (!Object.hasOwn(record, 'changes')) return bad('missing-changes', 'no "changes" field');
  const rawChanges = record.changes;
  if (!Array.isArray(rawChanges)) return bad('changes-not-array', `"changes" must be an array, got ${show(rawChanges)}`);
  if (rawChanges.length > MESSAGE_LIMITS.maxChanges) {
    return bad('too-many-changes', `"changes" has ${rawChanges.length} entries, the limit is ${MESSAGE_LIMITS.maxChanges}`);
  }

  const changes: Change[] = new Array(rawChanges.length);
  // Per-SKU sums of |delta| must stay safe: bounding those keeps every
  // partial sum safe, whatever subset the type filter later keeps, so nothing
  // is ever rounded. While the sum over all SKUs is safe, so is every
  // per-SKU sum, and no map is needed; from the change that takes the total
  // past the safe range on, they are tracked one by one, so the first
  // failure reported is the same as with a map from the start.
  let total = 0;
  let perSku: Map<string, number> | null = null;
  for (let i = 0; i < rawChanges.length; i++) {
    const raw: unknown = rawChanges[i];
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
      return bad('invalid-change', `${changeAt(i)} must be an object, got ${show(raw)}`);
    }
    const entry = raw as Record<string, unknown>;
    const sku = entry.sku;
    if (typeof sku !== 'string') return bad('invalid-sku', `${changeAt(i)}.sku must be a string, got ${show(sku)}`);
    if (sku.length === 0) return bad('invalid-sku', `${changeAt(i)}.sku must not be empty`);
    if (sku.length > MESSAGE_LIMITS.maxSkuLength) {
      return bad('invalid-sku', `${changeAt(i)}.sku is ${sku.length} characters, the limit is ${MESSAGE_LIMITS.maxSkuLength}`);
    }
    // Same as ids: two SKUs differing only in lone surrogates would share one count key.
    if (escaped && LONE_SURROGATE.test(sku)) return bad('invalid-sku', `${changeAt(i)}.sku contains a lone surrogate (not representable in UTF-8)`);
    const delta = entry.delta;
    if (typeof delta !== 'number') return bad('invalid-delta', `${changeAt(i)}.delta must be an integer, got ${show(delta)}`);
    if (!Number.isInteger(delta)) return bad('invalid-delta', `${changeAt(i)}.delta must be an integer, got ${show(delta)}`);
    if (!Number.isSafeInteger(delta)) {
      return bad('unsafe-delta', `${changeAt(i)}.delta ${show(delta)} is outside ±${Number.MAX_SAFE_INTEGER}`);
    }
    if (perSku === null) {
      // Exact while it is safe; once it is not, it is at least 2^53, rounded or not.
      total += Math.abs(delta);
      if (!Number.isSafeInteger(total)) {
        // Changes 0..i-1 summed safely (their total did): the per-SKU sums start from them.
        perSku = new Map();
        for (let j = 0; j < i; j++) {
          const { sku: previous, delta: d } = changes[j]!;
          perSku.set(previous, (perSku.get(previous) ?? 0) + Math.abs(d));
        }
      }
    }
    if (perSku !== null) {
      const sum = (perSku.get(sku) ?? 0) + Math.abs(delta);
      if (!Number.isSafeInteger(sum)) {
        return bad('unsafe-delta', `the deltas for ${changeAt(i)}.sku ${show(sku)} add up (in absolute value) beyond ${Number.MAX_SAFE_INTEGER}`);
      }
      perSku.set(sku, sum);
    }
    const type = entry.type;
    if (type !== undefined) {
      if (typeof type !== 'string') return bad('invalid-type', `${changeAt(i)}.type must be a string, got ${show(type)}`);
      if (type.length > MESSAGE_LIMITS.maxTypeLength) {
        return bad('invalid-type', `${changeAt(i)}.type is ${type.length} characters, the limit is ${MESSAGE_LIMITS.maxTypeLength}`);
      }
      changes[i] = { sku, delta, type };
    } else {
      changes[i] = { sku, delta };
    }
  }
  return { ok: true, message: { id, changes } };
}

/** `x-tally-reason` header value: the stable code, then the detail. */
export function formatReason(reason: BadMessageReason, detail: string): string {
  return `${reason}: ${detail}`;
}
