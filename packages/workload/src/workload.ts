/**
 * A reproducible workload with its ground truth: unique good messages,
 * duplicate publishes of some of them (some right after the original, some
 * far apart), and bad messages with the reason Tally must give each.
 */
import type { BadMessageReason } from '@tally/shared';
import { badSample } from './bad-corpus.js';
import { randomInt, seededRandom, zipfPicker } from './random.js';

export interface WorkloadOptions {
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
  /** Share of good messages that carry their id in the AMQP messageId property instead of the body. */
  readonly idInPropertyShare: number;
  /** Share of duplicates published right after their original (likely the same batch). */
  readonly nearDuplicateShare: number;
  readonly maxBytes: number;
}

export const WORKLOAD_DEFAULTS: WorkloadOptions = Object.freeze({
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
  /** The id Tally will see (good and duplicate). */
  readonly id?: string;
  readonly reason?: BadMessageReason;
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
  for (let n = 0; n < o.messages; n++) {
    const id = `${o.idPrefix}-${n}`;
    const count = randomInt(random, o.minChanges, o.maxChanges);
    const changes: Array<{ sku: string; delta: number; type?: string }> = [];
    for (let c = 0; c < count; c++) {
      const sku = skuName(pickSku());
      const delta = randomInt(random, o.minDelta, o.maxDelta);
      const type = o.types.length > 0 ? o.types[Math.floor(random() * o.types.length)] : undefined;
      changes.push(type === undefined ? { sku, delta } : { sku, delta, type });
      const accepted = o.acceptTypes === null || (type !== undefined && o.acceptTypes.has(type));
      if (accepted && delta !== 0) truth.set(sku, (truth.get(sku) ?? 0) + delta);
    }
    const inProperty = random() < o.idInPropertyShare;
    const body = Buffer.from(JSON.stringify(inProperty ? { changes } : { id, changes }));
    const publish: Publish = inProperty ? { kind: 'good', body, id, messageId: id } : { kind: 'good', body, id };
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
    const sample = badSample(b, b, o.maxBytes);
    badReasons.set(sample.reason, (badReasons.get(sample.reason) ?? 0) + 1);
    const publish: Publish = sample.messageId
      ? { kind: 'bad', body: sample.body, reason: sample.reason, messageId: `${o.idPrefix}-${sample.messageId}` }
      : { kind: 'bad', body: sample.body, reason: sample.reason };
    slots.push({ key: random() * o.messages, publish });
  }

  slots.sort((a, b) => a.key - b.key);
  for (const [sku, value] of truth) if (value === 0) truth.delete(sku);
  return { publishes: slots.map((slot) => slot.publish), truth, good: o.messages, duplicates, bad, badReasons };
}
