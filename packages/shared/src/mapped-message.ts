/**
 * A delivery in the user's own shape, read through its declared mapping
 * (message-mapping.ts) into the message the contract's shape would give.
 * Pure, never throws. Every body is hostile: the same size limit, UTF-8
 * check, JSON.parse and rules (message-rules.ts) as the contract's general
 * path, with the same reason codes; the detail names the mapped path of the
 * value (`invalid-delta: /lines/3/qty must be an integer, got "2"`) where the
 * contract's shape says `changes[3].delta`.
 *
 * There is no JSON.parse-free fast path here: the cost per message is in
 * docs/benchmark.md (a mapped shape against the contract's).
 */
import { resolvePointer } from './json-pointer.js';
import type { FieldPath, IdSource, MessageMapping } from './message-mapping.js';
import {
  AbsoluteDeltaSums,
  bad,
  deltaProblem,
  idProblem,
  isObject,
  MESSAGE_LIMITS,
  parseJsonBody,
  show,
  sizeProblem,
  skuProblem,
  typeProblem,
  unsafeSumDetail,
  type Change,
  type ParseOptions,
  type ParseResult,
} from './message-rules.js';

/** The AMQP properties a mapping may read the id from (amqplib's MessageProperties fits). */
export interface DeliveryProperties {
  readonly messageId?: unknown;
  readonly headers?: Readonly<Record<string, unknown>> | undefined;
}

/** The place of a change's value, for a detail string: built only when something is wrong there. */
function placeOf(mapping: MessageMapping, path: FieldPath, index: number): string {
  return path.from === 'body' ? path.text : `${mapping.changes.text}/${index}${path.text}`;
}

/** `changes-not-array: /lines is an object`: show() with the booleans spelled out. */
function shown(value: unknown): string {
  return typeof value === 'boolean' ? String(value) : show(value);
}

/** The value of an id source, or undefined when the source has none (the next one is tried). */
function idValue(source: IdSource, root: Record<string, unknown>, properties: DeliveryProperties): unknown {
  switch (source.kind) {
    case 'body':
      return resolvePointer(root, source.tokens);
    case 'messageId': {
      // As the contract's shape takes it: unset, null and "" are no id.
      const value = properties.messageId;
      return value === null || value === '' ? undefined : value;
    }
    case 'header': {
      const headers = properties.headers;
      return headers !== undefined && headers !== null && Object.hasOwn(headers, source.name) ? headers[source.name] : undefined;
    }
  }
}

/**
 * The id value a mapping reads from a delivery whose body may be anything
 * (a dead letter's): the first id source that has one, unchecked; undefined
 * when none does. For display (`tally dead list`), never for counting.
 */
export function mappedIdValue(root: unknown, properties: DeliveryProperties, mapping: MessageMapping): unknown {
  const object = isObject(root) ? root : {};
  for (const source of mapping.ids) {
    const value = idValue(source, object, properties);
    if (value !== undefined) return value;
  }
  return undefined;
}

function valueAt(path: FieldPath, root: unknown, change: unknown): unknown {
  return resolvePointer(path.from === 'body' ? root : change, path.tokens);
}

/**
 * @param properties the delivery's AMQP properties (messageId, headers), for the id sources that read them
 */
export function parseMappedMessage(body: Uint8Array, properties: DeliveryProperties, mapping: MessageMapping, options: ParseOptions): ParseResult {
  const tooBig = sizeProblem(body, options);
  if (tooBig !== null) return tooBig;
  const parsed = parseJsonBody(body);
  if (!parsed.ok) return parsed;
  const { root, escaped } = parsed;
  if (!isObject(root)) return bad('not-an-object', `the body must be a JSON object, got ${show(root)}`);

  let id: string | undefined;
  for (const source of mapping.ids) {
    const value = idValue(source, root, properties);
    if (value === undefined) continue;
    // A property or header is not from the body: any string may hold a lone surrogate.
    const problem = idProblem(value, source.kind === 'body' ? escaped : true);
    if (problem !== null) return bad('invalid-id', `${source.label} ${problem}`);
    id = value as string;
    break;
  }
  if (id === undefined) return bad('missing-id', `no ${mapping.ids.map((source) => source.label).join(' and no ')}`);

  const where = mapping.changes.text;
  const rawChanges = resolvePointer(root, mapping.changes.tokens);
  if (rawChanges === undefined) return bad('missing-changes', `no ${where}`);
  if (!Array.isArray(rawChanges)) return bad('changes-not-array', `${where} is ${shown(rawChanges)}`);
  if (rawChanges.length > MESSAGE_LIMITS.maxChanges) {
    return bad('too-many-changes', `${where} has ${rawChanges.length} entries, the limit is ${MESSAGE_LIMITS.maxChanges}`);
  }

  const { sku: skuPaths, skuSeparator, delta: deltaPath, type: typePath } = mapping;
  const changes: Change[] = new Array(rawChanges.length);
  const sums = new AbsoluteDeltaSums();
  for (let i = 0; i < rawChanges.length; i++) {
    const entry: unknown = rawChanges[i];
    // An array is a change too: "0/0" and "0/1" read a ["A-1", -2] pair.
    if (entry === null || typeof entry !== 'object') return bad('invalid-change', `${where}/${i} must be an object, got ${shown(entry)}`);

    let sku = '';
    for (let p = 0; p < skuPaths.length; p++) {
      const path = skuPaths[p]!;
      const part = valueAt(path, root, entry);
      if (part === undefined) return bad('invalid-sku', `${placeOf(mapping, path, i)} is missing`);
      const problem = skuProblem(part, escaped);
      if (problem !== null) return bad('invalid-sku', `${placeOf(mapping, path, i)} ${problem}`);
      // Every part but the last must be free of the separator, so that a
      // joined SKU splits back one way only: "W:1"+"A" and "W"+"1:A" would
      // otherwise count as one. (The last may hold it: split at the first ones.)
      if (p < skuPaths.length - 1 && (part as string).includes(skuSeparator)) {
        return bad(
          'invalid-sku',
          `${placeOf(mapping, path, i)} ${show(part)} contains the separator ${JSON.stringify(skuSeparator)}, so the joined SKU would be ambiguous`,
        );
      }
      sku = p === 0 ? (part as string) : `${sku}${skuSeparator}${part as string}`;
    }
    if (sku.length > MESSAGE_LIMITS.maxSkuLength) {
      const places = skuPaths.map((path) => placeOf(mapping, path, i)).join(' + ');
      return bad('invalid-sku', `${places} joined is ${sku.length} characters, the limit is ${MESSAGE_LIMITS.maxSkuLength}`);
    }

    const delta = valueAt(deltaPath, root, entry);
    if (delta === undefined) return bad('invalid-delta', `${placeOf(mapping, deltaPath, i)} is missing`);
    const badDelta = deltaProblem(delta);
    if (badDelta !== null) return bad(badDelta.reason, `${placeOf(mapping, deltaPath, i)} ${badDelta.problem}`);
    if (!sums.add(sku, delta as number, i, changes)) {
      return bad('unsafe-delta', unsafeSumDetail(skuPaths.map((path) => placeOf(mapping, path, i)).join(' + '), sku));
    }

    const type = typePath === null ? undefined : valueAt(typePath, root, entry);
    if (type !== undefined) {
      const badType = typeProblem(type);
      if (badType !== null) return bad('invalid-type', `${placeOf(mapping, typePath!, i)} ${badType}`);
      changes[i] = { sku, delta: delta as number, type: type as string };
    } else {
      changes[i] = { sku, delta: delta as number };
    }
  }
  return { ok: true, message: { id, changes } };
}
