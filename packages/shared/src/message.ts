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
import { readCommonForm } from './message-common-form.js';
import {
  AbsoluteDeltaSums,
  asBuffer,
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
  type BadMessageReason,
  type Change,
  type ParseOptions,
  type ParseResult,
} from './message-rules.js';

export {
  BAD_MESSAGE_REASONS,
  MESSAGE_LIMITS,
  type BadMessageReason,
  type Change,
  type InventoryMessage,
  type ParseOptions,
  type ParseResult,
} from './message-rules.js';

/** Where change i is, for a detail string: built only when something is wrong there. */
function changeAt(i: number): string {
  return `changes[${i}]`;
}

/**
 * @param body the raw delivery body
 * @param messageIdProperty the AMQP `messageId` property, used when the body has no `id`
 */
export function parseMessage(body: Uint8Array, messageIdProperty: unknown, options: ParseOptions): ParseResult {
  const tooBig = sizeProblem(body, options);
  if (tooBig !== null) return tooBig;
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
  const parsed = parseJsonBody(body);
  if (!parsed.ok) return parsed;
  const { root, escaped } = parsed;
  if (!isObject(root)) return bad('not-an-object', `the body must be a JSON object, got ${show(root)}`);

  let id: string;
  if (Object.hasOwn(root, 'id')) {
    const problem = idProblem(root.id, escaped);
    if (problem !== null) return bad('invalid-id', `id ${problem}`);
    id = root.id as string;
  } else if (messageIdProperty !== undefined && messageIdProperty !== null && messageIdProperty !== '') {
    // Not from the body: any string may hold a lone surrogate.
    const problem = idProblem(messageIdProperty, true);
    if (problem !== null) return bad('invalid-id', `the messageId property ${problem}`);
    id = messageIdProperty as string;
  } else {
    return bad('missing-id', 'no "id" field and no messageId property: the message cannot be deduplicated');
  }

  if (!Object.hasOwn(root, 'changes')) return bad('missing-changes', 'no "changes" field');
  const rawChanges = root.changes;
  if (!Array.isArray(rawChanges)) return bad('changes-not-array', `"changes" must be an array, got ${show(rawChanges)}`);
  if (rawChanges.length > MESSAGE_LIMITS.maxChanges) {
    return bad('too-many-changes', `"changes" has ${rawChanges.length} entries, the limit is ${MESSAGE_LIMITS.maxChanges}`);
  }

  const changes: Change[] = new Array(rawChanges.length);
  const sums = new AbsoluteDeltaSums();
  for (let i = 0; i < rawChanges.length; i++) {
    const entry: unknown = rawChanges[i];
    if (!isObject(entry)) return bad('invalid-change', `${changeAt(i)} must be an object, got ${show(entry)}`);
    const sku = entry.sku;
    const badSku = skuProblem(sku, escaped);
    if (badSku !== null) return bad('invalid-sku', `${changeAt(i)}.sku ${badSku}`);
    const delta = entry.delta;
    const badDelta = deltaProblem(delta);
    if (badDelta !== null) return bad(badDelta.reason, `${changeAt(i)}.delta ${badDelta.problem}`);
    if (!sums.add(sku as string, delta as number, i, changes)) return bad('unsafe-delta', unsafeSumDetail(`${changeAt(i)}.sku`, sku as string));
    const type = entry.type;
    if (type !== undefined) {
      const badType = typeProblem(type);
      if (badType !== null) return bad('invalid-type', `${changeAt(i)}.type ${badType}`);
      changes[i] = { sku: sku as string, delta: delta as number, type: type as string };
    } else {
      changes[i] = { sku: sku as string, delta: delta as number };
    }
  }
  return { ok: true, message: { id, changes } };
}

/** `x-tally-reason` header value: the stable code, then the detail. */
export function formatReason(reason: BadMessageReason, detail: string): string {
  return `${reason}: ${detail}`;
}
