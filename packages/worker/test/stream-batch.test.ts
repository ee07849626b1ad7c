/**
 * Stream batches against the real Redis (stream-batch.ts,
 * lua/stream_batch.lua): invariants 16 to 18 where they are kept, in the
 * script. A replayed offset is never applied twice, whatever batches it
 * comes in and whoever sends them; a watermark never passes an offset that
 * was not applied; a watermark found below the one expected applies nothing
 * of its partition and says so.
 */
import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import fc from 'fast-check';
import { Redis } from 'ioredis';
import {
  classifyError,
  countKey,
  decodePositions,
  encodePositions,
  PART_DONE,
  PART_NEW,
  PART_REWIND,
  watermarkKey,
  type BatchResult,
  type BatchTask,
} from '@tally/shared';
import { deleteKeys, testWorkerSettings } from '@tally/testkit';
import type { BatchLog } from '../src/batch-log.js';
import { runStreamBatch } from '../src/stream-batch.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const quiet: BatchLog = { warn() {}, error() {} };
const VSHARD = 3;

/** One part of a log: its partition, offset and changes. */
interface LogPart {
  readonly partition: number;
  readonly offset: number;
  readonly changes: Array<[string, number]>;
}

/** A batch of `parts`, each at its place in its log, expecting `expected` per partition (-1 when absent). */
function task(parts: readonly LogPart[], expected: Readonly<Record<number, number>> = {}): BatchTask {
  const buffer = encodePositions({
    count: parts.length,
    partition: (i) => parts[i]!.partition,
    offset: (i) => parts[i]!.offset,
    expected: (partition) => expected[partition] ?? -1,
  });
  return { vshard: VSHARD, batchId: randomUUID(), changes: parts.map((p) => p.changes), positions: decodePositions(buffer, parts.length) };
}

/** A partition's log: `n` parts from `first` on, offsets gapped like a stream's (one per 10). */
function logOf(partition: number, n: number, first = 0): LogPart[] {
  return Array.from({ length: n }, (_, i) => ({
    partition,
    offset: first + i + Math.floor(i / 10),
    changes: [
      [`sku-${(i * 7) % 13}`, 1 + (i % 5)],
      [`sku-${(i * 3) % 11}`, -1],
    ],
  }));
}

function truthOf(parts: readonly LogPart[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const part of parts) for (const [sku, delta] of part.changes) out.set(sku, (out.get(sku) ?? 0) + delta);
  return out;
}

describe('stream batch against a real Redis', function () {
  this.timeout(60_000);
  let redis: Redis;
  let prefix: string;
  const run = (t: BatchTask, overrides: Partial<ReturnType<typeof testWorkerSettings>> = {}): Promise<BatchResult> =>
    runStreamBatch(redis, testWorkerSettings({ redisUrl: REDIS_URL, prefix, source: 'stream', ...overrides }), t, quiet);

  async function counts(skus: Iterable<string>): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    for (const sku of skus) {
      const value = await redis.get(countKey(prefix, VSHARD, sku));
      if (value !== null && Number(value) !== 0) out.set(sku, Number(value));
    }
    return out;
  }

  async function watermark(partition: number): Promise<number | null> {
    const value = await redis.hget(watermarkKey(prefix, VSHARD), String(partition));
    return value === null ? null : Number(value);
  }

  before(() => {
    redis = new Redis(REDIS_URL);
  });
  beforeEach(() => {
    prefix = `t.stream-batch.${randomUUID().slice(0, 8)}:`;
  });
  afterEach(() => deleteKeys(REDIS_URL, prefix));
  after(() => redis.quit());

  it('applies a batch once, raises each partition to its highest offset, and applies nothing of it again', async () => {
    const parts = [...logOf(0, 30), ...logOf(1, 20, 100)];
    const first = await run(task(parts));
    expect([...first.marked]).to.deep.equal(parts.map(() => PART_NEW));
    expect(first.watermarks).to.deep.include({ partition: 0, offset: parts[29]!.offset, expected: -1, rolledBack: false });
    expect(await watermark(0)).to.equal(parts[29]!.offset);
    expect(await watermark(1)).to.equal(parts[49]!.offset);
    const truth = truthOf(parts);
    expect(await counts(truth.keys())).to.deep.equal(new Map([...truth].filter(([, n]) => n !== 0)));
    // The same batch again (a lost reply, a restart): every part at or below its watermark.
    const again = await run(task(parts));
    expect([...again.marked]).to.deep.equal(parts.map(() => PART_DONE));
    expect(await counts(truth.keys())).to.deep.equal(new Map([...truth].filter(([, n]) => n !== 0)));
  });

  it('splits a batch that straddles the watermark: exactly the offsets above it are applied (invariants 16, 17)', async () => {
    const log = logOf(0, 40);
    await run(task(log.slice(0, 25)));
    const straddling = log.slice(10, 40);
    const result = await run(task(straddling));
    expect([...result.marked]).to.deep.equal(straddling.map((_, i) => (i < 15 ? PART_DONE : PART_NEW)));
    const truth = truthOf(log);
    expect(await counts(truth.keys())).to.deep.equal(new Map([...truth].filter(([, n]) => n !== 0)));
    expect(await watermark(0)).to.equal(log[39]!.offset);
  });

  it('applies nothing of a partition whose watermark is below the one expected, and reports the rollback; the other partitions apply (invariant 18)', async () => {
    const a = logOf(0, 20);
    const b = logOf(1, 20);
    await run(task(a.slice(0, 10)));
    // This daemon saw partition 0 at a[14]: Redis holds less, so writes were lost.
    const result = await run(task([...a.slice(15), ...b], { 0: a[14]!.offset }));
    expect([...result.marked]).to.deep.equal([...a.slice(15).map(() => PART_REWIND), ...b.map(() => PART_NEW)]);
    expect(result.watermarks).to.deep.include({ partition: 0, offset: a[9]!.offset, expected: a[14]!.offset, rolledBack: true });
    expect(await watermark(0), 'the watermark stays where it was: nothing of the partition was applied').to.equal(a[9]!.offset);
    expect(await watermark(1)).to.equal(b[19]!.offset);
    const truth = truthOf([...a.slice(0, 10), ...b]);
    expect(await counts(new Set([...truth.keys(), ...truthOf(a).keys()]))).to.deep.equal(new Map([...truth].filter(([, n]) => n !== 0)));
  });

  it('a refused part counts nothing, the rest counts, and the watermark passes it (its message is dead-lettered)', async () => {
    const log = logOf(0, 10);
    const poisoned = { partition: 0, offset: log[9]!.offset + 1, changes: [['poisoned', 1] as [string, number], ['sku-1', 5] as [string, number]] };
    await redis.set(countKey(prefix, VSHARD, 'poisoned'), 'not a number');
    const result = await run(task([...log, poisoned]));
    expect(result.refusals.map((r) => [r.part, r.sku])).to.deep.equal([[10, 'poisoned']]);
    const truth = truthOf(log);
    expect(await counts(truth.keys())).to.deep.equal(new Map([...truth].filter(([, n]) => n !== 0)));
    expect(await watermark(0)).to.equal(poisoned.offset);
  });

  it('a watermark that is not an offset stops the batch with TALLY_WATERMARK, classed fatal: nothing is applied or dead-lettered', async () => {
    // Classed data (TALLY_SCRIPT_ARGS, before), batch isolation would dead-letter every message of the partition.
    const log = logOf(0, 10);
    await redis.hset(watermarkKey(prefix, VSHARD), '0', 'set by hand');
    const failure = await run(task(log)).then(
      () => null,
      (error: Error) => error,
    );
    expect(failure?.message).to.match(/^TALLY_WATERMARK partition 0's watermark in .*wm:\{3\} is not an offset: 'set by hand'; set that field/);
    expect(classifyError(failure), 'a stall the batch retries visibly, not data').to.equal('fatal');
    expect(await counts(truthOf(log).keys()), 'nothing applied').to.deep.equal(new Map());
  });

  it('offsets past 2^32 up to 2^53 - 1 compare and store exactly', async () => {
    const high = 2 ** 53 - 10;
    const log = [0, 1, 2, 3].map((i) => ({ partition: 2, offset: high + i, changes: [['big', 1] as [string, number]] }));
    await run(task(log.slice(0, 2)));
    expect(await watermark(2)).to.equal(high + 1);
    const result = await run(task(log.slice(1)));
    expect([...result.marked]).to.deep.equal([PART_DONE, PART_NEW, PART_NEW]);
    expect(await redis.hget(watermarkKey(prefix, VSHARD), '2')).to.equal(String(high + 3));
    expect(await counts(['big'])).to.deep.equal(new Map([['big', 4]]));
  });

  it('two daemons reading one log in batches of their own, racing, with reruns of what they sent: every offset applied exactly once', async () => {
    // The shard's lane sees both partitions interleaved in arrival order; each daemon cuts it into its own batches.
    const log = [...logOf(0, 60), ...logOf(1, 60, 5_000)].sort((x, y) => (x.offset % 97) - (y.offset % 97) || x.offset - y.offset);
    const byPartition = (parts: LogPart[]) => [...parts].sort((x, y) => x.partition - y.partition || x.offset - y.offset);
    const inLogOrder = byPartition(log);
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.integer({ min: 1, max: 25 }), { minLength: 1, maxLength: 20 }),
        fc.array(fc.integer({ min: 1, max: 25 }), { minLength: 1, maxLength: 20 }),
        fc.array(fc.constantFrom('a', 'b', 'both', 'rerun-a', 'rerun-b'), { minLength: 1, maxLength: 60 }),
        async (sizesA, sizesB, schedule) => {
          prefix = `t.stream-batch.${randomUUID().slice(0, 8)}:`;
          // Both read the log from its start (nothing applied before it), in order per partition.
          const cut = (sizes: number[]) => {
            const batches: LogPart[][] = [];
            for (let at = 0, i = 0; at < inLogOrder.length; i++) {
              const size = sizes[i % sizes.length]!;
              batches.push(inLogOrder.slice(at, at + size));
              at += size;
            }
            return batches;
          };
          const daemons = { a: { batches: cut(sizesA), next: 0 }, b: { batches: cut(sizesB), next: 0 } };
          const step = (d: { batches: LogPart[][]; next: number }) => (d.next < d.batches.length ? run(task(d.batches[d.next++]!)) : null);
          const rerun = (d: { batches: LogPart[][]; next: number }) => (d.next > 0 ? run(task(d.batches[d.next - 1]!)) : null);
          for (const move of schedule) {
            if (move === 'a') await step(daemons.a);
            else if (move === 'b') await step(daemons.b);
            else if (move === 'both') await Promise.all([step(daemons.a), step(daemons.b)]);
            else await rerun(move === 'rerun-a' ? daemons.a : daemons.b);
          }
          // Whatever the schedule left, one of them reads on to the end.
          while (daemons.a.next < daemons.a.batches.length) await step(daemons.a);
          const truth = truthOf(log);
          expect(await counts(truth.keys())).to.deep.equal(new Map([...truth].filter(([, n]) => n !== 0)));
          await deleteKeys(REDIS_URL, prefix);
        },
      ),
      { numRuns: 30 },
    );
  });
});
