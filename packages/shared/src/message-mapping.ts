/**
 * TALLY_MESSAGE_MAPPING: where a message in the user's own shape keeps its
 * id, its changes, and each change's SKU, delta and type. This file turns the
 * declaration (a small JSON object) into a validated, frozen MessageMapping,
 * or a ConfigError naming the variable, the key and what is wrong; reading a
 * body through it is mapped-message.ts. Pure.
 *
 *   {"id": ["/eventId", "header:x-event-id"], "changes": "/lines",
 *    "sku": ["/warehouse", "0/product/sku"], "skuSeparator": ":",
 *    "delta": "0/qty", "type": "0/reason"}
 *
 * - A path starting with "/" is a JSON Pointer (RFC 6901) from the body's
 *   root. Within a change (sku, delta, type) a path may instead start with
 *   "0": a Relative JSON Pointer from the change itself ("0/qty" is the
 *   change's `qty`); no other relative start is accepted.
 * - The id is the first of its sources that is present: a body pointer,
 *   `messageId` (the AMQP property) or `header:<name>` (an AMQP header).
 * - Several SKU paths are joined by `skuSeparator` (required then, and only
 *   then): `WH3` + `A-1` with ":" counts as `WH3:A-1`.
 */
import { ConfigError } from './errors.js';
import { parseJsonPointer, type PointerTokens } from './json-pointer.js';
import { LONE_SURROGATE } from './message-common-form.js';

/** Where the id is read from. `label` names the source in a dead letter's reason (`/eventId`, `header x-event-id`). */
export type IdSource =
  | { readonly kind: 'body'; readonly tokens: PointerTokens; readonly label: string }
  | { readonly kind: 'messageId'; readonly label: string }
  | { readonly kind: 'header'; readonly name: string; readonly label: string };

/** A path to a value of a change: from the body's root, or from the change. */
export interface FieldPath {
  readonly from: 'body' | 'change';
  readonly tokens: PointerTokens;
  /**
   * The pointer as declared: the whole of an absolute one (`/warehouse`),
   * the part after "0" of a relative one (`/product/sku`), so that the place
   * of change i is `<changes>/<i><text>` (`/lines/3/product/sku`).
   */
  readonly text: string;
}

export interface MessageMapping {
  readonly ids: readonly IdSource[];
  readonly changes: { readonly tokens: PointerTokens; readonly text: string };
  /** One path, or several joined by skuSeparator. */
  readonly sku: readonly FieldPath[];
  /** '' when sku has one path. */
  readonly skuSeparator: string;
  readonly delta: FieldPath;
  /** null: the changes have no type (TALLY_ACCEPT_TYPES then skips every one). */
  readonly type: FieldPath | null;
  /** The declaration, normalised (keys in order, lists as lists), for the start-up log. */
  readonly declared: string;
}

const KEYS = ['id', 'changes', 'sku', 'skuSeparator', 'delta', 'type'] as const;
const REQUIRED = ['id', 'changes', 'sku', 'delta'] as const;
/** More would be a mistake rather than a shape: a SKU of more than four parts, or more than four places for one id. */
const MAX_ID_SOURCES = 4;
const MAX_SKU_PATHS = 4;
const MAX_SEPARATOR_LENGTH = 16;

export const MESSAGE_ID_SOURCE = 'messageId';
export const HEADER_SOURCE_PREFIX = 'header:';

/** Throws the variable's ConfigError for the key `at`. */
function refuse(variable: string, at: string, problem: string): never {
  throw new ConfigError(variable, `${at}: ${problem}`);
}

/** A string, or a non-empty list of at most `max` strings (one value is a list of one). */
function stringList(variable: string, at: string, value: unknown, max: number): string[] {
  const list = typeof value === 'string' ? [value] : value;
  if (!Array.isArray(list) || list.length === 0 || list.length > max || list.some((item) => typeof item !== 'string')) {
    refuse(variable, at, `expected a string or a list of 1 to ${max} strings, got ${JSON.stringify(value)}`);
  }
  return list as string[];
}

function absolutePointer(variable: string, at: string, text: string, what: string): PointerTokens {
  if (text === '') refuse(variable, at, `"" is the whole body, which is an object, not ${what}`);
  const syntax = parseJsonPointer(text);
  if (!syntax.ok) {
    // "eventId" for "/eventId" is the likely slip: say so.
    const hint = text.startsWith('/') ? '' : ` (did you mean "/${text}"?)`;
    refuse(variable, at, `${syntax.problem}${hint}`);
  }
  return syntax.tokens;
}

function idSource(variable: string, at: string, text: string): IdSource {
  if (text === MESSAGE_ID_SOURCE) return { kind: 'messageId', label: 'messageId property' };
  if (text.startsWith(HEADER_SOURCE_PREFIX)) {
    const name = text.slice(HEADER_SOURCE_PREFIX.length);
    if (name === '' || name.length > 255) refuse(variable, at, `a header name is 1 to 255 characters, got ${JSON.stringify(text)}`);
    return { kind: 'header', name, label: `header ${name}` };
  }
  if (!text.startsWith('/')) {
    refuse(
      variable,
      at,
      `expected a JSON Pointer into the body ("/eventId"), "${MESSAGE_ID_SOURCE}" or "${HEADER_SOURCE_PREFIX}<name>", got ${JSON.stringify(text)}`,
    );
  }
  return { kind: 'body', tokens: absolutePointer(variable, at, text, 'an id'), label: text };
}

/**
 * A path within a change: "/…" from the body's root, "0/…" from the change
 * (a Relative JSON Pointer with no step up).
 */
function fieldPath(variable: string, at: string, text: string): FieldPath {
  if (text.startsWith('/')) return { from: 'body', tokens: absolutePointer(variable, at, text, 'a value'), text };
  if (text === '0') refuse(variable, at, '"0" alone is the change itself: name a value in it, e.g. "0/qty"');
  if (/^\d/.test(text)) {
    if (!text.startsWith('0/')) {
      refuse(variable, at, `a path relative to the change starts with "0/" (steps up, "1/…", and "#" are not supported), got ${JSON.stringify(text)}`);
    }
    const rest = text.slice(1);
    const syntax = parseJsonPointer(rest);
    if (!syntax.ok) refuse(variable, at, syntax.problem);
    return { from: 'change', tokens: syntax.tokens, text: rest };
  }
  return refuse(
    variable,
    at,
    `expected a JSON Pointer from the body's root ("/warehouse") or one from the change ("0/${text.replace(/^\/+/, '')}"), got ${JSON.stringify(text)}`,
  );
}

/**
 * The mapping TALLY_MESSAGE_MAPPING declares. Every mistake is refused here,
 * at start, rather than found one dead letter at a time.
 */
export function parseMessageMapping(variable: string, text: string): MessageMapping {
  let declaration: unknown;
  try {
    declaration = JSON.parse(text);
  } catch (error) {
    throw new ConfigError(variable, `not JSON (${error instanceof Error ? error.message : String(error)}); expected an object such as {"id": "/eventId", ...}`);
  }
  if (declaration === null || typeof declaration !== 'object' || Array.isArray(declaration)) {
    throw new ConfigError(variable, `expected a JSON object with the keys ${KEYS.join(', ')}`);
  }
  const fields = declaration as Record<string, unknown>;
  for (const key of Object.keys(fields)) {
    if (!(KEYS as readonly string[]).includes(key)) refuse(variable, key, `unknown key; the keys are ${KEYS.join(', ')}`);
  }
  for (const key of REQUIRED) if (!Object.hasOwn(fields, key)) refuse(variable, key, 'missing; id, changes, sku and delta are required');

  const idTexts = stringList(variable, 'id', fields.id, MAX_ID_SOURCES);
  const ids = idTexts.map((source, i) => idSource(variable, idTexts.length === 1 ? 'id' : `id[${i}]`, source));

  if (typeof fields.changes !== 'string')
    refuse(variable, 'changes', `expected a JSON Pointer to the array of changes ("/lines"), got ${JSON.stringify(fields.changes)}`);
  const changesText = fields.changes;
  const changes = { tokens: absolutePointer(variable, 'changes', changesText, 'an array'), text: changesText };

  const skuTexts = stringList(variable, 'sku', fields.sku, MAX_SKU_PATHS);
  const sku = skuTexts.map((path, i) => fieldPath(variable, skuTexts.length === 1 ? 'sku' : `sku[${i}]`, path));

  let skuSeparator = '';
  if (sku.length > 1) {
    const separator = fields.skuSeparator;
    if (separator === undefined) refuse(variable, 'skuSeparator', `missing; sku joins ${sku.length} paths, so say what goes between them (":", for example)`);
    // An empty one would make "WH3"+"1A" and "WH31"+"A" one SKU.
    if (typeof separator !== 'string' || separator.length === 0 || separator.length > MAX_SEPARATOR_LENGTH) {
      refuse(variable, 'skuSeparator', `expected a string of 1 to ${MAX_SEPARATOR_LENGTH} characters, got ${JSON.stringify(separator)}`);
    }
    // It goes into every count key: like a SKU, it must have a UTF-8 form.
    if (LONE_SURROGATE.test(separator)) refuse(variable, 'skuSeparator', 'contains a lone surrogate (not representable in UTF-8)');
    skuSeparator = separator;
  } else if (fields.skuSeparator !== undefined) {
    refuse(variable, 'skuSeparator', 'only used when sku lists several paths; remove it, or list the paths to join');
  }

  if (typeof fields.delta !== 'string') refuse(variable, 'delta', `expected a path ("0/qty"), got ${JSON.stringify(fields.delta)}`);
  const delta = fieldPath(variable, 'delta', fields.delta);

  let type: FieldPath | null = null;
  if (fields.type !== undefined) {
    if (typeof fields.type !== 'string') refuse(variable, 'type', `expected a path ("0/reason"), got ${JSON.stringify(fields.type)}`);
    type = fieldPath(variable, 'type', fields.type);
  }

  // With sku and delta both read from the root, every change of a message
  // would count the same SKU and delta, once per entry of the array: almost
  // certainly "/qty" written for "0/qty".
  if (delta.from === 'body' && sku.every((path) => path.from === 'body')) {
    refuse(
      variable,
      'delta',
      `sku and delta are all read from the body's root, so every change would be the same; read them from the change ("0${delta.text}")`,
    );
  }

  const declared = JSON.stringify({
    id: idTexts,
    changes: changesText,
    sku: skuTexts,
    ...(sku.length > 1 ? { skuSeparator } : {}),
    delta: fields.delta,
    ...(type !== null ? { type: fields.type } : {}),
  });
  return Object.freeze({ ids: Object.freeze(ids), changes, sku: Object.freeze(sku), skuSeparator, delta, type, declared });
}
