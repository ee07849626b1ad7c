/**
 * What a message must satisfy whatever shape it arrives in (the contract's
 * own, message.ts, or a declared mapping, message-mapping.ts): the reason
 * codes, the limits, the decoding of the body, and the checks of an id, a
 * SKU, a delta, a type and the per-SKU sums. Pure, never throws.
 *
 * Each check returns what is wrong as a phrase that follows the place it was
 * found (`must be a string, got 42`), or null. The caller names the place
 * (`changes[3].sku` for the contract's shape, `/lines/3/product/sku` under a
 * mapping) only when something is wrong there, so the good path builds no
 * strings.
 */
import { isUtf8 } from 'node:buffer';
import { LONE_SURROGATE } from './message-common-form.js';

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

export type BadMessage = Extract<ParseResult, { readonly ok: false }>;

export function bad(reason: BadMessageReason, detail: string): BadMessage {
  return { ok: false, reason, detail };
}

/** The body as a Buffer (amqplib's already is), without copying. */
export function asBuffer(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/** The checks made before a body is decoded: empty, oversized. null: go on. */
export function sizeProblem(body: Uint8Array, options: ParseOptions): BadMessage | null {
  if (body.byteLength === 0) return bad('empty-body', 'the body is empty');
  if (body.byteLength > options.maxBytes) return bad('oversized-body', `the body is ${body.byteLength} bytes, the limit is ${options.maxBytes}`);
  return null;
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
export function decodeUtf8(body: Uint8Array): string | null {
  const bytes = asBuffer(body);
  const start = bytes.length >= 3 && bytes[0] === BOM[0] && bytes[1] === BOM[1] && bytes[2] === BOM[2] ? 3 : 0;
  if (!isUtf8(bytes)) return null;
  return bytes.toString('utf8', start);
}

/**
 * The body decoded and parsed, or the reason it cannot be. V8's JSON.parse
 * is iterative, so no nesting depth within the size limit overflows the
 * stack (message.test.ts and message-mapping.test.ts parse a deeply nested
 * body). `escaped`: the text has a backslash, so a string in it may hold a
 * lone surrogate.
 */
export function parseJsonBody(body: Uint8Array): { readonly ok: true; readonly root: unknown; readonly escaped: boolean } | BadMessage {
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
  return { ok: true, root, escaped: text.includes('\\') };
}

/** Short, log-safe rendering of a hostile value for a detail string. */
export function show(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'string') {
    return value.length > 40 ? `a string of length ${value.length}` : JSON.stringify(value);
  }
  if (typeof value === 'object') return 'an object';
  if (typeof value === 'number') return String(value);
  return typeof value;
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/**
 * @param mayHaveLoneSurrogates false when `value` comes from a body without
 * a backslash: valid UTF-8 decodes to paired surrogates only, so a lone one
 * can only come from a `\ud800` escape in the JSON.
 */
export function idProblem(value: unknown, mayHaveLoneSurrogates: boolean): string | null {
  if (typeof value !== 'string') return `must be a string, got ${show(value)}`;
  if (value.length === 0) return 'must not be empty';
  if (value.length > MESSAGE_LIMITS.maxIdLength) return `is ${value.length} characters, the limit is ${MESSAGE_LIMITS.maxIdLength}`;
  // A lone surrogate ("\ud800" in the JSON) has no UTF-8 form: Redis would
  // get U+FFFD instead, and two different ids would share one marker, the
  // second skipped as a duplicate of the first: a silent loss.
  if (mayHaveLoneSurrogates && LONE_SURROGATE.test(value)) return 'contains a lone surrogate (not representable in UTF-8)';
  return null;
}

/** A SKU as it becomes a count key: a string of 1 to 256 characters, representable in UTF-8. */
export function skuProblem(value: unknown, mayHaveLoneSurrogates: boolean): string | null {
  if (typeof value !== 'string') return `must be a string, got ${show(value)}`;
  if (value.length === 0) return 'must not be empty';
  if (value.length > MESSAGE_LIMITS.maxSkuLength) return `is ${value.length} characters, the limit is ${MESSAGE_LIMITS.maxSkuLength}`;
  // Same as ids: two SKUs differing only in lone surrogates would share one count key.
  if (mayHaveLoneSurrogates && LONE_SURROGATE.test(value)) return 'contains a lone surrogate (not representable in UTF-8)';
  return null;
}

/** A delta: an integer (invalid-delta) within ±(2^53−1) (unsafe-delta). */
export function deltaProblem(value: unknown): { readonly reason: 'invalid-delta' | 'unsafe-delta'; readonly problem: string } | null {
  if (typeof value !== 'number' || !Number.isInteger(value)) return { reason: 'invalid-delta', problem: `must be an integer, got ${show(value)}` };
  if (!Number.isSafeInteger(value)) return { reason: 'unsafe-delta', problem: `${show(value)} is outside ±${Number.MAX_SAFE_INTEGER}` };
  return null;
}

/** A present type: a string of at most 64 characters. */
export function typeProblem(value: unknown): string | null {
  if (typeof value !== 'string') return `must be a string, got ${show(value)}`;
  if (value.length > MESSAGE_LIMITS.maxTypeLength) return `is ${value.length} characters, the limit is ${MESSAGE_LIMITS.maxTypeLength}`;
  return null;
}

/**
 * Per-SKU sums of |delta| must stay safe: bounding those keeps every partial
 * sum safe, whatever subset the type filter later keeps, so nothing is ever
 * rounded. While the sum over all SKUs is safe, so is every per-SKU sum, and
 * no map is needed; from the change that takes the total past the safe range
 * on, they are tracked one by one, so the first failure reported is the same
 * as with a map from the start.
 */
export class AbsoluteDeltaSums {
  private total = 0;
  private perSku: Map<string, number> | null = null;

  /**
   * Adds change `index`; false when its SKU's sum passes the safe range.
   * @param earlier the changes accepted so far, indexes 0 to index-1
   */
  add(sku: string, delta: number, index: number, earlier: readonly Change[]): boolean {
    if (this.perSku === null) {
      // Exact while it is safe; once it is not, it is at least 2^53, rounded or not.
      this.total += Math.abs(delta);
      if (Number.isSafeInteger(this.total)) return true;
      // Changes 0..index-1 summed safely (their total did): the per-SKU sums start from them.
      this.perSku = new Map();
      for (let j = 0; j < index; j++) {
        const { sku: previous, delta: d } = earlier[j]!;
        this.perSku.set(previous, (this.perSku.get(previous) ?? 0) + Math.abs(d));
      }
    }
    const sum = (this.perSku.get(sku) ?? 0) + Math.abs(delta);
    if (!Number.isSafeInteger(sum)) return false;
    this.perSku.set(sku, sum);
    return true;
  }
}

/** The detail of an unsafe per-SKU sum; `where` names the SKU's place. */
export function unsafeSumDetail(where: string, sku: string): string {
  return `the deltas for ${where} ${show(sku)} add up (in absolute value) beyond ${Number.MAX_SAFE_INTEGER}`;
}
