/**
 * The usual delivery body read without JSON.parse, for the coordinator's
 * main thread, which reads every delivery. Pure.
 *
 * The common form is what a JSON serialiser prints for the documented message:
 *
 *   {"id":"<s>","changes":[{"sku":"<s>","delta":<n>},{"sku":"<s>","delta":<n>,"type":"<s>"}]}
 *
 * or the same without `"id":"<s>",`, when the AMQP messageId property is an
 * id the general path would take (a string of allowed length, no lone
 * surrogate).
 *
 * Strings are printable ASCII without escapes. Deltas are integers of at most
 * 15 digits, with no leading zero, fraction or exponent. There is no
 * whitespace and no other key, and the keys come in this order. Anything
 * else returns null, and parseMessage's general path (JSON.parse, then the
 * checks) decides the body. The same happens when a value breaks a limit,
 * so that every reason and detail comes from that one place.
 *
 * This means a body read here is one the general path accepts with the
 * same message:
 * - every byte is ASCII, so the body is valid UTF-8 with no BOM;
 * - there are no escapes, so there are no lone surrogates;
 * - each key appears once, so JSON.parse would keep the same values;
 * - at most 15 digits are below 2^53, so each delta is a safe integer;
 * - the sum of |delta| over the message is checked to be safe, so every
 *   per-SKU sum is too.
 *
 * The cost saved is JSON.parse building an object per change that is
 * thrown away at once, and the decoding of the whole body into a string:
 * docs/benchmark.md has the figures. message-common-form.test.ts compares
 * the two paths on random and mutated bodies.
 */

export interface CommonFormLimits {
  readonly maxIdLength: number;
  readonly maxSkuLength: number;
  readonly maxTypeLength: number;
  readonly maxChanges: number;
}

/** A change as parseMessage returns it: `type` present only when the body has one. */
export type CommonFormChange = { readonly sku: string; readonly delta: number } | { readonly sku: string; readonly delta: number; readonly type: string };

export interface CommonFormMessage {
  readonly id: string;
  readonly changes: CommonFormChange[];
}

function bytesOf(text: string): Uint8Array {
  return Uint8Array.from(text, (c) => c.charCodeAt(0));
}

const ID_OPEN = bytesOf('{"id":"');
const CHANGES_OPEN = bytesOf('","changes":[');
/** The body of a message whose id is in the messageId property. */
const ONLY_CHANGES_OPEN = bytesOf('{"changes":[');
const SKU_OPEN = bytesOf('{"sku":"');
const DELTA_OPEN = bytesOf('","delta":');
const TYPE_OPEN = bytesOf(',"type":"');

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const MINUS = 0x2d;
const ZERO = 0x30;
const NINE = 0x39;
const CLOSE_BRACE = 0x7d;
const CLOSE_BRACKET = 0x5d;
const MAX_DELTA_DIGITS = 15;

/** Whether `literal` is at `at`. */
function matches(body: Uint8Array, at: number, literal: Uint8Array): boolean {
  if (at + literal.length > body.length) return false;
  for (let i = 0; i < literal.length; i++) if (body[at + i] !== literal[i]) return false;
  return true;
}

/**
 * Where the string whose contents start at `from` ends (its closing quote),
 * or -1 when it holds anything but printable ASCII other than a backslash
 * (an escape, a control character, a multi-byte sequence: the general path's
 * business), or never ends.
 */
function stringEnd(body: Uint8Array, from: number): number {
  for (let i = from; i < body.length; i++) {
    const byte = body[i]!;
    if (byte === QUOTE) return i;
    if (byte < 0x20 || byte > 0x7e || byte === BACKSLASH) return -1;
  }
  return -1;
}

/**
 * With the `u` flag a paired surrogate is one code point, so only lone ones
 * match \p{Cs}. A lone one has no UTF-8 form: two ids differing only there
 * would share one marker in Redis.
 */
export const LONE_SURROGATE = /\p{Cs}/u;

/**
 * The message, or null when the body is not in the common form or breaks a
 * limit (the general path then decides it).
 *
 * @param messageIdProperty the AMQP `messageId` property, the id when the body has none
 */
export function readCommonForm(body: Buffer, limits: CommonFormLimits, messageIdProperty: unknown): CommonFormMessage | null {
  let id: string;
  let at: number;
  if (matches(body, 0, ID_OPEN)) {
    at = ID_OPEN.length;
    const idEnd = stringEnd(body, at);
    if (idEnd <= at || idEnd - at > limits.maxIdLength) return null;
    id = body.toString('latin1', at, idEnd);
    at = idEnd;
    if (!matches(body, at, CHANGES_OPEN)) return null;
    at += CHANGES_OPEN.length;
  } else if (matches(body, 0, ONLY_CHANGES_OPEN)) {
    // The property is not from the body: any string may hold a lone surrogate.
    const property = messageIdProperty;
    if (typeof property !== 'string' || property.length === 0 || property.length > limits.maxIdLength || LONE_SURROGATE.test(property)) return null;
    id = property;
    at = ONLY_CHANGES_OPEN.length;
  } else return null;

  const changes: CommonFormChange[] = [];
  // Bounds every per-SKU sum of |delta| (see the file's comment).
  let total = 0;
  if (body[at] === CLOSE_BRACKET) at++;
  else
    for (;;) {
      if (changes.length === limits.maxChanges || !matches(body, at, SKU_OPEN)) return null;
      at += SKU_OPEN.length;
      const skuEnd = stringEnd(body, at);
      if (skuEnd <= at || skuEnd - at > limits.maxSkuLength) return null;
      const sku = body.toString('latin1', at, skuEnd);
      at = skuEnd;
      if (!matches(body, at, DELTA_OPEN)) return null;
      at += DELTA_OPEN.length;

      const negative = body[at] === MINUS;
      if (negative) at++;
      const digitsFrom = at;
      let magnitude = 0;
      while (at < body.length && body[at]! >= ZERO && body[at]! <= NINE) magnitude = magnitude * 10 + (body[at++]! - ZERO);
      const digits = at - digitsFrom;
      if (digits === 0 || digits > MAX_DELTA_DIGITS || (digits > 1 && body[digitsFrom] === ZERO)) return null;
      // -0 stays -0, as JSON.parse reads it.
      const delta = negative ? -magnitude : magnitude;
      total += magnitude;
      if (!Number.isSafeInteger(total)) return null;

      if (body[at] === CLOSE_BRACE) {
        changes.push({ sku, delta });
        at++;
      } else {
        if (!matches(body, at, TYPE_OPEN)) return null;
        at += TYPE_OPEN.length;
        const typeEnd = stringEnd(body, at);
        if (typeEnd < at || typeEnd - at > limits.maxTypeLength || body[typeEnd + 1] !== CLOSE_BRACE) return null;
        changes.push({ sku, delta, type: body.toString('latin1', at, typeEnd) });
        at = typeEnd + 2;
      }
      if (body[at] === COMMA) {
        at++;
        continue;
      }
      if (body[at] !== CLOSE_BRACKET) return null;
      at++;
      break;
    }
  if (body[at] !== CLOSE_BRACE || at + 1 !== body.length) return null;
  return { id, changes };
}
