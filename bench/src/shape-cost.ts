/**
 * Pure apart from the clock: what reading a delivery costs the daemon's main
 * thread in each message shape, in process. The same workload (same seed,
 * SKUs, deltas, types) is generated in the contract's shape and in the
 * foreign one; each delivery is parsed (deliveryParser: the contract's fast
 * path, or TALLY_MESSAGE_MAPPING's JSON.parse path) and split by shard, as
 * the daemon's onDelivery does. Passes alternate between the shapes, and the
 * median of each is compared: one run, one ratio.
 */
import { deliveryParser, parseMessageMapping, splitByShard, type DeliveryParser } from '@tally/shared';
import { FOREIGN_SHAPE_MAPPING, generateWorkload, type Publish, type WorkloadOptions } from '@tally/workload';
import { median } from './stats.js';

export interface ParseCost {
  readonly messages: number;
  readonly passes: number;
  /** Median µs per message of parse + split, each shape. */
  readonly contractUs: number;
  readonly foreignUs: number;
  readonly ratio: number;
  readonly contractBytes: number;
  readonly foreignBytes: number;
}

const VIRTUAL_SHARDS = 16;

/** One pass over the deliveries; returns ns per message. The checksum keeps the work from being optimised away. */
function pass(publishes: readonly Publish[], parse: DeliveryParser, sink: { n: number }): number {
  const started = process.hrtime.bigint();
  for (const p of publishes) {
    const parsed = parse(p.body, { messageId: p.messageId, headers: p.headers });
    if (!parsed.ok) throw new Error(`shape-cost: a workload message did not parse: ${parsed.reason}: ${parsed.detail}`);
    sink.n += splitByShard(parsed.message.changes, VIRTUAL_SHARDS, null).size;
  }
  return Number(process.hrtime.bigint() - started) / publishes.length;
}

export function measureParseCost(workload: Partial<WorkloadOptions>, passes: number): ParseCost {
  const base = { ...workload, duplicateRate: 0, badRate: 0, types: ['sale', 'return'] };
  const contract = generateWorkload({ ...base, shape: 'contract', idPrefix: 'cost' }).publishes;
  const foreign = generateWorkload({ ...base, shape: 'foreign', idPrefix: 'cost' }).publishes;
  const options = { maxBytes: 65_536 };
  const parseContract = deliveryParser(null, options);
  const parseForeign = deliveryParser(parseMessageMapping('TALLY_MESSAGE_MAPPING', JSON.stringify(FOREIGN_SHAPE_MAPPING)), options);
  const sink = { n: 0 };
  // Warm-up: both paths optimised before anything is timed.
  for (let i = 0; i < 3; i++) {
    pass(contract, parseContract, sink);
    pass(foreign, parseForeign, sink);
  }
  const contractNs: number[] = [];
  const foreignNs: number[] = [];
  for (let i = 0; i < passes; i++) {
    // Alternating order, so that neither shape always runs after a collection of the other's garbage.
    if (i % 2 === 0) {
      contractNs.push(pass(contract, parseContract, sink));
      foreignNs.push(pass(foreign, parseForeign, sink));
    } else {
      foreignNs.push(pass(foreign, parseForeign, sink));
      contractNs.push(pass(contract, parseContract, sink));
    }
  }
  if (sink.n === 0) throw new Error('shape-cost: nothing was split');
  const bytes = (publishes: readonly Publish[]) => publishes.reduce((sum, p) => sum + p.body.length, 0) / publishes.length;
  const contractUs = median(contractNs) / 1000;
  const foreignUs = median(foreignNs) / 1000;
  return {
    messages: contract.length,
    passes,
    contractUs,
    foreignUs,
    ratio: foreignUs / contractUs,
    contractBytes: bytes(contract),
    foreignBytes: bytes(foreign),
  };
}
