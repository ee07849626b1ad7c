import { expect } from 'chai';
import { bucketExpiresAt, bucketsToCheck, defaultBucketWidthS, subBucketsAfter, type Change } from '@tally/shared';
import { generateWorkload } from '@tally/workload';
import { metricValue, parseDaemonProgress, partsPerBatch } from '../src/daemon-metrics.js';
import { BenchUsageError, parseBenchArgs, STEADY_CONTENDERS } from '../src/options.js';
import { seededRandom } from '@tally/workload';
import { evenShares, expiryBitmap, partsPerMessageByShard, steadyPopulation, subBucketCounts } from '../src/steady-population.js';
import { waitForBucketS } from '../src/steady-state.js';

const WIDTH = defaultBucketWidthS(600);

describe('steady-state population', () => {
  it('holds rate × parts × width per shard in each full live bucket, the current one up to its elapsed fraction', () => {
    // 1,000 buckets of 300 s in, plus 75 s: a quarter of the current bucket has elapsed.
    const nowS = 1_000 * WIDTH + 75;
    const population = steadyPopulation({ rate: 20_000, markerTtlS: 600, bucketWidthS: WIDTH, partsPerMessageByShard: evenShares(3.9, 16), nowS });
    expect(WIDTH).to.equal(300);
    expect(population.currentBucket).to.equal(1_000);
    expect(population.oldestBucket).to.equal(998);
    expect(population.currentBucket - population.oldestBucket + 1).to.equal(bucketsToCheck(WIDTH, 600));
    expect(population.currentFraction).to.equal(0.25);
    expect(population.partsPerMessage).to.be.closeTo(3.9, 1e-9);
    // 20,000 × 3.9 / 16 × 300 = 1,462,500 markers per shard and full bucket.
    expect(population.fullBucketMarkers).to.deep.equal(new Array(16).fill(1_462_500));
    expect(population.buckets).to.have.length(3 * 16);
    const of = (bucket: number) => population.buckets.filter((b) => b.bucket === bucket);
    for (const b of [...of(998), ...of(999)]) expect(b.markers).to.equal(1_462_500);
    for (const b of of(1_000)) expect(b.markers).to.equal(365_625);
    expect(population.totalMarkers).to.equal(16 * (2 * 1_462_500 + 365_625));
    // 1,462,500 / 64 = 22,852 hashes wanted: the next power of two, as openBucket sizes it.
    for (const b of population.buckets) {
      expect(b.subBuckets).to.equal(32_768);
      expect(b.expiresAt).to.equal(bucketExpiresAt(b.bucket, WIDTH, 600));
    }
  });

  it('fills the bucket of now to a set fraction whatever the clock (--steady-phase), the older buckets as before', () => {
    const input = { rate: 20_000, markerTtlS: 600, bucketWidthS: WIDTH, partsPerMessageByShard: evenShares(3.9, 16) };
    for (const elapsedS of [3, 75, 290]) {
      const population = steadyPopulation({ ...input, nowS: 1_000 * WIDTH + elapsedS, currentFraction: 0.5 });
      expect(population.currentFraction).to.equal(0.5);
      expect(population.currentBucket).to.equal(1_000);
      for (const b of population.buckets) expect(b.markers, `bucket ${b.bucket}`).to.equal(b.bucket === 1_000 ? 731_250 : 1_462_500);
    }
    // Unset, the clock's elapsed fraction.
    expect(steadyPopulation({ ...input, nowS: 1_000 * WIDTH + 75, currentFraction: null }).currentFraction).to.equal(0.25);
  });

  it('sizes each shard from its own full bucket, as openBucket does from the bucket before', () => {
    const shares = [0.01, 0.5, 2, 0, 1.39];
    const population = steadyPopulation({ rate: 5_000, markerTtlS: 600, bucketWidthS: WIDTH, partsPerMessageByShard: shares, nowS: 7 * WIDTH + 299 });
    for (const b of population.buckets) expect(b.subBuckets).to.equal(subBucketsAfter(Math.round(5_000 * shares[b.vshard]! * WIDTH), 256));
    // The rule itself: enough hashes for 64 markers each, a power of two, at most 65,536.
    expect(subBucketsAfter(64, 256)).to.equal(1);
    expect(subBucketsAfter(65, 256)).to.equal(2);
    expect(subBucketsAfter(1_462_500, 256)).to.equal(32_768);
    expect(subBucketsAfter(1e9, 256)).to.equal(65_536);
    // A shard no message touches has no marker and no bucket.
    expect(population.buckets.some((b) => b.vshard === 3)).to.equal(false);
  });

  it('reads every live bucket at any TTL and width', () => {
    const population = steadyPopulation({ rate: 100, markerTtlS: 20, bucketWidthS: 10, partsPerMessageByShard: [1], nowS: 1_005.5 });
    expect(population.currentBucket).to.equal(100);
    expect(population.oldestBucket).to.equal(98);
    expect(population.buckets.map((b) => b.markers)).to.deep.equal([1_000, 1_000, 550]);
    expect(() => steadyPopulation({ rate: -1, markerTtlS: 20, bucketWidthS: 10, partsPerMessageByShard: [1], nowS: 0 })).to.throw(RangeError);
  });

  it('counts about 3.9 parts per message for the default workload (1-8 changes over 16 shards)', () => {
    const workload = generateWorkload({ messages: 4_000, skus: 3_000, seed: 3, badRate: 0, duplicateRate: 0 });
    const changes = workload.publishes.map((p) => (JSON.parse(p.body.toString('utf8')) as { changes: Change[] }).changes);
    const shares = partsPerMessageByShard(changes, 16);
    expect(shares).to.have.length(16);
    expect(shares.reduce((a, b) => a + b, 0)).to.be.within(3.7, 4.0);
    // Expected distinct shards of k uniform SKUs, averaged over k = 1..8.
    const expected = [1, 2, 3, 4, 5, 6, 7, 8].reduce((sum, k) => sum + 16 * (1 - (15 / 16) ** k), 0) / 8;
    expect(expected).to.be.closeTo(3.9, 0.01);
    expect(partsPerMessageByShard([], 4)).to.deep.equal([0, 0, 0, 0]);
    expect(
      partsPerMessageByShard(
        [
          [
            { sku: 'a', delta: 1 },
            { sku: 'a', delta: 2 },
          ],
        ],
        16,
      ).reduce((a, b) => a + b, 0),
    ).to.equal(1);
  });

  it('spreads a bucket over its hashes exactly (a multinomial draw), the same for the same seed', () => {
    const counts = subBucketCounts(100_000, 2_048, seededRandom(7));
    expect(counts.reduce((a, b) => a + b, 0)).to.equal(100_000);
    const mean = 100_000 / 2_048;
    expect(Math.max(...counts)).to.be.below(mean * 2);
    expect(Math.min(...counts)).to.be.above(mean / 3);
    expect(subBucketCounts(1_000, 64, seededRandom(7))).to.deep.equal(subBucketCounts(1_000, 64, seededRandom(7)));
    expect(subBucketCounts(1_000, 64, seededRandom(8))).not.to.deep.equal(subBucketCounts(1_000, 64, seededRandom(7)));
  });

  it('marks in x exactly the hashes that exist, byte sub >> 3, bit sub & 7', () => {
    expect([...expiryBitmap(Uint32Array.from([1, 0, 3, 0, 0, 0, 0, 0, 0, 2]))]).to.deep.equal([0b101, 0b10]);
    expect(expiryBitmap(new Uint32Array(16)).length).to.equal(0);
    expect([...expiryBitmap(new Uint32Array(16).fill(1))]).to.deep.equal([0xff, 0xff]);
  });

  it('waits for the next bucket only when the fill and the drain would not fit in the current one', () => {
    expect(waitForBucketS(3_000 + 290, 300, 30)).to.equal(10.5);
    expect(waitForBucketS(3_000 + 100, 300, 30)).to.equal(0);
    // A need longer than half a bucket crosses a boundary anyway: no wait.
    expect(waitForBucketS(3_000 + 290, 300, 200)).to.equal(0);
  });
});

describe('the daemon progress the drains read', () => {
  const text = [
    '# HELP tally_received_total deliveries taken from the queue',
    '# TYPE tally_received_total counter',
    'tally_received_total{messaging_system="rabbitmq",messaging_destination_name="q",otel_scope_name="tally"} 5020',
    'tally_received_totals_other 9',
    'tally_deliveries_in_flight{messaging_system="rabbitmq",messaging_destination_name="q",otel_scope_name="tally"} 20',
  ].join('\n');

  it('reads received and in flight, so acked = received - in flight', () => {
    expect(parseDaemonProgress(text)).to.deep.equal({ received: 5_020, inFlight: 20, acked: 5_000, batches: null, batchParts: null });
    expect(metricValue('plain_metric 12\n', 'plain_metric')).to.equal(12);
    expect(metricValue(text, 'tally_counted_total')).to.equal(null);
    expect(() => parseDaemonProgress('')).to.throw(/tally_received_total/);
  });

  it("takes the window's mean batch from the batch-size histogram's count and sum at its two ends", () => {
    const at = (batches: number, parts: number) =>
      parseDaemonProgress(`${text}\ntally_batch_size_count{otel_scope_name="tally"} ${batches}\ntally_batch_size_sum{otel_scope_name="tally"} ${parts}\n`);
    expect(at(10, 4_000)).to.include({ batches: 10, batchParts: 4_000 });
    // The warm-up's 10 batches of 400 are not the window's 40 of 100.
    expect(partsPerBatch(at(10, 4_000), at(50, 8_000))).to.equal(100);
    expect(partsPerBatch(null, at(50, 8_000)), 'no warm-up: the whole drain').to.equal(160);
    expect(partsPerBatch(at(10, 4_000), at(10, 4_000)), 'no batch in the window').to.equal(null);
    expect(partsPerBatch(at(10, 4_000), parseDaemonProgress(text)), 'no histogram').to.equal(null);
  });
});

describe('steady-state flags', () => {
  it('defaults to 20,000 msg/s, the references and both modes, and drops the latency runs and sweeps', () => {
    const options = parseBenchArgs(['--steady-state']);
    expect(options.steadyState).to.equal(true);
    expect(options.steadyRate).to.equal(20_000);
    expect(options.contenders).to.deep.equal(STEADY_CONTENDERS);
    expect(options.sweeps).to.deep.equal([]);
    expect(options.loads).to.deep.equal([]);
    expect(options.markerTtls).to.deep.equal([]);
    expect(options.warmupMessages).to.equal(5_000);
    expect(parseBenchArgs(['--steady-state', '--steady-rate', '500', '--quick']).steadyRate).to.equal(500);
    expect(parseBenchArgs(['--steady-state']).steadyPhase, 'the clock unless asked').to.equal(null);
    expect(parseBenchArgs(['--steady-state', '--steady-phase', '0.5']).steadyPhase).to.equal(0.5);
    expect(parseBenchArgs(['--quick']).warmupMessages).to.equal(1_000);
    expect(parseBenchArgs(['--warmup', '0']).warmupMessages).to.equal(0);
  });

  it('names the flag in every refusal', () => {
    expect(() => parseBenchArgs(['--steady-rate', '500'])).to.throw(BenchUsageError, /--steady-rate goes with --steady-state/);
    expect(() => parseBenchArgs(['--steady-state', '--steady-rate', '0'])).to.throw(BenchUsageError, /--steady-rate must be an integer/);
    expect(() => parseBenchArgs(['--steady-phase', '0.5'])).to.throw(BenchUsageError, /--steady-phase goes with --steady-state/);
    expect(() => parseBenchArgs(['--steady-state', '--steady-phase', '1'])).to.throw(BenchUsageError, /--steady-phase/);
    expect(() => parseBenchArgs(['--steady-state', '--profile'])).to.throw(BenchUsageError, /--steady-state goes with a plain run or --scale-out/);
    expect(() => parseBenchArgs(['--warmup', '-1'])).to.throw(BenchUsageError, /--warmup/);
  });
});
