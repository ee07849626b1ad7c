/**
 * A reproducible workload with its ground truth: unique good messages,
 * duplicate publishes of some of them (some right after the original, some
 * far apart), and bad messages with the reason Tally must give each.
 */
import type { BadMessageReason } from '@tally/shared';
import { badSample, foreignBadSample } from './bad-corpus.js';
import { FOREIGN_ID_HEADER, foreignBody, foreignSku, WAREHOUSES } from './foreign-shape.js';
import { randomInt, seededRandom, zipfPicker } from './random.js';

/**
 * `contract`: the documented `{"id", "changes": [{"sku", "delta", "type"}]}`.
 * `foreign`: a shape of the user's own, read through FOREIGN_SHAPE_MAPPING
 * (foreign-shape.ts): `{"eventId", "warehouse", "lines": [{"product": {"sku"},
 * "qty", "reason"}]}`, counted under the SKU `<warehouse>:<sku>`.
 */
export type MessageShape = 'contract' | 'foreign';
export const MESSAGE_SHAPES: readonly MessageShape[] = Object.freeze(['contract', 'foreign']);

export interface WorkloadOptions {
  readonly shape: MessageShape;
  readonly messages: number;
  readonly skus: number;
  readonly minChanges: number;
  readonly maxChanges: number;
  /** Share of extra publishes that repeat an earlier message (same id, same body). */
  readonly duplicateRate: number;
  /** Share of extra publishes that are bad messages. */
  readonly badRate: number;
  readonly seed: number;
  readonly minDelta: number;
  readonly maxDelta: number;
  /** Change types to draw from; empty: no type field. */
  readonly types: readonly string[];
  /** Accepted types, to compute the truth the daemon should reach; null accepts all. */
  readonly acceptTypes: ReadonlySet<string> | null;
  /** Zipf exponent of SKU popularity; 0 is uniform. */
  readonly zipf: number;
  /** Prefix of message ids, so runs do not collide in Redis. */
  readonly idPrefix: string;
  /**
   * Share of good messages that carry their id outside the body instead: the
   * AMQP messageId property (contract shape), the x-event-id header (foreign).
   */
  readonly idInPropertyShare: number;
  /** Share of duplicates published right after their original (likely the same batch). */
  readonly nearDuplicateShare: number;
  readonly maxBytes: number;
}

export const WORKLOAD_DEFAULTS: WorkloadOptions = Object.freeze({
  shape: 'contract' as MessageShape,
  messages: 10_000,
  skus: 1_000,
  minChanges: 1,
  maxChanges: 8,
  duplicateRate: 0.02,
  badRate: 0,
  seed: 1,
  minDelta: 1,
  maxDelta: 9,
  types: [],
  acceptTypes: null,
  zipf: 0,
  idPrefix: 'msg',
  idInPropertyShare: 0.1,
  nearDuplicateShare: 0.5,
  maxBytes: 65_536,
});

export type PublishKind = 'good' | 'duplicate' | 'bad';

export interface Publish {
  readonly kind: PublishKind;
  readonly body: Buffer;
  readonly messageId?: string;
  /** AMQP headers to publish with (the foreign shape's id header). */
  readonly headers?: Readonly<Record<string, string>>;
  /** The id Tally will see (good and duplicate). */
  readonly id?: string;
  readonly reason?: BadMessageReason;
  /** Under a mapping: the mapped path the dead letter's reason must name (`/lines/0/qty`). */
  readonly path?: string;
}

export interface Workload {
  readonly publishes: Publish[];
  /** SKU -> expected count; SKUs whose truth is 0 are omitted. */
  readonly truth: Map<string, number>;
  readonly good: number;
  readonly duplicates: number;
  readonly bad: number;
  readonly badReasons: Map<BadMessageReason, number>;
}

export function skuName(rank: number): string {
  return `SKU-${String(rank).padStart(6, '0')}`;
}

export function generateWorkload(partial: Partial<WorkloadOptions> = {}): Workload {
  const o: WorkloadOptions = { ...WORKLOAD_DEFAULTS, ...partial };
  const random = seededRandom(o.seed);
  const pickSku = zipfPicker(o.skus, o.zipf, random);
  const truth = new Map<string, number>();

  type Slot = { key: number; publish: Publish };
  const slots: Slot[] = [];
  const good: Publish[] = [];
  const foreign = o.shape === 'foreign';
  for (let n = 0; n < o.messages; n++) {
    const id = `${o.idPrefix}-${n}`;
    const count = randomInt(random, o.minChanges, o.maxChanges);
    // The foreign shape: one warehouse per message, part of each change's SKU.
    const warehouse = foreign ? WAREHOUSES[Math.floor(random() * WAREHOUSES.length)]! : '';
    const changes: Array<{ sku: string; delta: number; type?: string }> = [];
    for (let c = 0; c < count; c++) {
      const sku = skuName(pickSku());
      const delta = randomInt(random, o.minDelta, o.maxDelta);
      const type = o.types.length > 0 ? o.types[Math.floor(random() * o.types.length)] : undefined;
      changes.push(type === undefined ? { sku, delta } : { sku, delta, type });
      const accepted = o.acceptTypes === null || (type !== undefined && o.acceptTypes.has(type));
      const counted = foreign ? foreignSku(warehouse, sku) : sku;
      if (accepted && delta !== 0) truth.set(counted, (truth.get(counted) ?? 0) + delta);
    }
    const outside = random() < o.idInPropertyShare;
    let publish: Publish;
    if (foreign) {
      const body = foreignBody(outside ? null : id, warehouse, changes);
      publish = outside ? { kind: 'good', body, id, headers: { [FOREIGN_ID_HEADER]: id } } : { kind: 'good', body, id };
    } else {
      const body = Buffer.from(JSON.stringify(outside ? { changes } : { id, changes }));
      publish = outside ? { kind: 'good', body, id, messageId: id } : { kind: 'good', body, id };
    }
    good.push(publish);
    slots.push({ key: n, publish });
  }

  const duplicates = Math.round(o.messages * o.duplicateRate);
  for (let d = 0; d < duplicates; d++) {
    const original = Math.floor(random() * o.messages);
    const near = random() < o.nearDuplicateShare;
    const key = near ? original + 0.5 + random() * 0.4 : original + 1 + random() * (o.messages - original);
    const source = good[original]!;
    slots.push({ key, publish: { ...source, kind: 'duplicate' } });
  }

  const bad = Math.round(o.messages * o.badRate);
  const badReasons = new Map<BadMessageReason, number>();
  for (let b = 0; b < bad; b++) {
    const sample = foreign ? foreignBadSample(b, b, o.maxBytes) : badSample(b, b, o.maxBytes);
    badReasons.set(sample.reason, (badReasons.get(sample.reason) ?? 0) + 1);
    const outsideId =
      sample.messageId === undefined
        ? {}
        : foreign
          ? { headers: { [FOREIGN_ID_HEADER]: `${o.idPrefix}-${sample.messageId}` } }
          : { messageId: `${o.idPrefix}-${sample.messageId}` };
    const publish: Publish = {
      kind: 'bad',
      body: sample.body,
      reason: sample.reason,
      ...outsideId,
      ...(sample.path !== undefined ? { path: sample.path } : {}),
    };
    slots.push({ key: random() * o.messages, publish });
  }

  slots.sort((a, b) => a.key - b.key);
  for (const [sku, value] of truth) if (value === 0) truth.delete(sku);
  return { publishes: slots.map((slot) => slot.publish), truth, good: o.messages, duplicates, bad, badReasons };
}
