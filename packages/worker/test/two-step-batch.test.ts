import { spawn } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import {
  bucketOf,
  countKey,
  markerBucketKey,
  markerBaseKey,
  markerDigest,
  markerMetaKey,
  ScriptReply,
  subBucketOf,
  subBucketsAfter,
  type BatchTask,
  type WorkerSettings,
} from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import type { BatchLog } from '../src/batch-log.js';
import { BatchWritesLostError } from '../src/replica-wait.js';
import { runAtomicBatch } from '../src/atomic-batch.js';
import { evalshaArgs, runScript } from '../src/lua-scripts.js';
import { OCCUPY_MARKERS, runTwoStepBatch, WRITE_COUNTS } from '../src/two-step-batch.js';
import { markerEntry, readMarkers, startPrivateRedis, startProxy, testWorkerSettings } from '@tally/testkit';
import { monitorFence } from './monitor-fence.js';

/** Tasks built by the tests carry the ids (the coordinator sends digests only). */
type TestTask = BatchTask & { readonly ids: readonly string[] };
const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const quiet: BatchLog = process.env.TEST_VERBOSE
  ? { warn: (f, m) => console.log(Date.now() % 100000, m, JSON.stringify(f)), error: (f, m) => console.log(m, f) }
  : { warn() {}, error() {} };

function settingsFor(prefix: string, over: Partial<WorkerSettings> = {}): WorkerSettings {
  // A fixed bucket width, whatever TTL a test sets.
  return testWorkerSettings({ redisUrl: REDIS_URL, prefix, markerBucketS: 300, ...over });
}

function taskFor(runId: string, vshard = 3, parts = 50): TestTask {
  const ids: string[] = [];
  const changes: Array<Array<[string, number]>> = [];
  for (let i = 0; i < parts; i++) {
    ids.push(`${runId}-m${i}`);
    changes.push([
      [`S${i % 7}`, 1 + (i % 3)],
      [`T${i % 5}`, 2],
    ]);
  }
  return { vshard, batchId: randomUUID(), ids, changes };
}

/** The same parts in a new batch, as after a redelivery: a new batch id, so no receipt answers for it. */
function redelivered(task: BatchTask): BatchTask {
  return { ...task, batchId: randomUUID() };
}

function expectedCounts(task: TestTask): Map<string, number> {
  const sums = new Map<string, number>();
  for (const part of task.changes) for (const [sku, delta] of part) sums.set(sku, (sums.get(sku) ?? 0) + delta);
  return sums;
}

async function countsIn(redis: Redis, prefix: string, task: TestTask): Promise<Map<string, number>> {
  const result = new Map<string, number>();
  for (const sku of expectedCounts(task).keys()) result.set(sku, Number(await redis.get(countKey(prefix, task.vshard, sku))));
  return result;
}

/** Parts of the task whose marker is done. */
async function markersIn(redis: Redis, prefix: string, task: TestTask): Promise<number> {
  const { done } = await readMarkers(redis, prefix);
  return task.ids.filter((id) => done.has(markerEntry(task.vshard, id))).length;
}

/** Parts of the task that are claimed and not done. */
async function claimsIn(redis: Redis, prefix: string, task: TestTask): Promise<number> {
  const { claims } = await readMarkers(redis, prefix);
  return task.ids.filter((id) => claims.has(markerEntry(task.vshard, id))).length;
}

describe('two-step batch against a real Redis', function () {
  this.timeout(60_000);
  let redis: Redis;
  let prefix: string;
  let runId: string;

  beforeEach(() => {
    runId = randomBytes(4).toString('hex');
    prefix = `t.batch.${runId}:`;
    redis = new Redis(REDIS_URL);
  });
  afterEach(async () => {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  it('writes the counts once and occupies every marker; a second run is all duplicates', async () => {
    const client = createRedisClient(REDIS_URL, 'test');
    try {
      const task = taskFor(runId);
      const first = await runTwoStepBatch(client, settingsFor(prefix), task, quiet);
      expect([...first.marked]).to.deep.equal(task.ids.map(() => 0));
      expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task));
      expect(await markersIn(redis, prefix, task)).to.equal(task.ids.length);
      const [seconds] = await redis.time();
      const settings = settingsFor(prefix);
      const markerHash = markerBucketKey(
        prefix,
        task.vshard,
        bucketOf(Number(seconds), settings.markerBucketS),
        subBucketOf(markerDigest(task.ids[0]!), settings.markerSubBuckets),
      );
      // The bucket's end plus the marker TTL: at least the TTL, at most one bucket width more.
      expect(await redis.ttl(markerHash)).to.be.within(595, 900);
      expect(await claimsIn(redis, prefix, task), 'every claim became done').to.equal(0);
      expect(await redis.ttl(countKey(prefix, task.vshard, 'S0'))).to.be.greaterThan(2_500_000);

      const second = await runTwoStepBatch(client, settingsFor(prefix), redelivered(task), quiet);
      expect([...second.marked]).to.deep.equal(task.ids.map(() => 1));
      expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task));
    } finally {
      client.disconnect();
    }
  });

  it('writes the counts before it occupies any marker (invariant 2, seen by MONITOR)', async () => {
    // The test's connections ready first, and no extra one: a command of ours (a ready-check
    // INFO) that reaches MONITOR's connection in the same read as its OK is taken by ioredis
    // for a reply ("Command queue state error", seen in CI).
    await redis.ping();
    const monitor = await redis.monitor();
    const seen: string[] = [];
    // MONITOR also shows the commands a script runs, in the order Redis ran them.
    monitor.on('monitor', (_time: string, args: string[]) => {
      if (!args[0] || !args[1]?.startsWith(prefix)) return;
      const command = args[0].toLowerCase();
      // A marker HSET is a claim (value c<token>:<ms>) or an occupation (value 1).
      // A claim writes the batch's number into the marker hashes; the occupation turns the batch's record in the meta hash to '1'.
      if (command === 'hset' && args[1].endsWith(':m') && args[2]?.startsWith('b')) seen.push(`${args[3] === '1' ? 'occupy' : 'record'} ${args[1]}`);
      else if (command === 'hset' && !args[1].endsWith(':m')) seen.push(`${args[3] === '1' ? 'occupy' : 'claim'} ${args[1]}`);
      else seen.push(`${command} ${args[1]}`);
    });
    const client = createRedisClient(REDIS_URL, 'test');
    try {
      const task = taskFor(runId);
      await runTwoStepBatch(client, settingsFor(prefix), task, quiet);
      await monitorFence(monitor, redis, `${prefix}monitor-fence`);
      const firstMarkerSet = seen.findIndex((line) => line.startsWith(`occupy ${prefix}mk:`));
      const lastIncr = seen.map((line) => line.startsWith('incrby ')).lastIndexOf(true);
      const receipt = seen.findIndex((line) => line.startsWith(`set ${prefix}w:`));
      const lastClaim = seen.map((line) => line.startsWith('claim ')).lastIndexOf(true);
      expect(firstMarkerSet, 'markers were set').to.be.greaterThan(-1);
      expect(lastClaim, 'the parts were claimed before the first INCRBY').to.be.within(
        0,
        seen.findIndex((line) => line.startsWith('incrby ')),
      );
      expect(seen.filter((line) => line.startsWith('incrby ')).length, 'one INCRBY per SKU').to.equal(expectedCounts(task).size);
      expect(lastIncr, 'every INCRBY comes before the first marker SET').to.be.lessThan(firstMarkerSet);
      expect(receipt, 'the write receipt lands with the counts, before any marker').to.be.within(lastIncr, firstMarkerSet);
    } finally {
      client.disconnect();
      monitor.disconnect();
    }
  });

  it('a SIGKILL inside the crash window leaves counts written and markers absent: the redelivery overcounts visibly, never loses', async () => {
    const task = taskFor(runId);
    const script = `
      import { runTwoStepBatch } from ${JSON.stringify(fileURLToPath(new URL('../src/index.js', import.meta.url)))};
      import { createRedisClient } from ${JSON.stringify(import.meta.resolve('@tally/runtime'))};
      const settings = JSON.parse(process.env.SETTINGS);
      const task = JSON.parse(process.env.TASK);
      const client = createRedisClient(settings.redisUrl, 'crasher');
      await runTwoStepBatch(client, settings, task, { warn() {}, error() {} }, {
        afterCountWrite: () => process.kill(process.pid, 'SIGKILL'),
      });
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      env: { ...process.env, SETTINGS: JSON.stringify(settingsFor(prefix)), TASK: JSON.stringify(task) },
      stdio: 'inherit',
    });
    const signal = await new Promise((resolve) => child.on('exit', (_code, sig) => resolve(sig)));
    expect(signal).to.equal('SIGKILL');
    expect(await countsIn(redis, prefix, task), 'counts written before the crash').to.deep.equal(expectedCounts(task));
    expect(await markersIn(redis, prefix, task), 'no marker occupied').to.equal(0);
    expect(await claimsIn(redis, prefix, task), 'the dead process left its claims').to.equal(task.ids.length);

    const client = createRedisClient(REDIS_URL, 'test');
    try {
      // Another daemon gets the redelivery at once: the dead one's claims are live, so it holds every part back.
      const early = await runTwoStepBatch(client, settingsFor(prefix, { claimToken: 'b2', claimTtlMs: 5_000 }), redelivered(task), quiet);
      expect([...early.marked], 'held by the live claims').to.deep.equal(task.ids.map(() => 2));
      expect(await countsIn(redis, prefix, task), 'a held part adds nothing').to.deep.equal(expectedCounts(task));
      // Once the claims are older than the claim TTL they are taken over. The
      // redelivery finds no marker and counts again: double, never zero.
      await new Promise((resolve) => setTimeout(resolve, 5_100));
      const redelivery = await runTwoStepBatch(client, settingsFor(prefix, { claimToken: 'b2', claimTtlMs: 5_000 }), redelivered(task), quiet);
      expect(redelivery.claimTakeovers, 'every dead claim taken over, and said so').to.equal(task.ids.length);
      expect([...redelivery.marked].every((m) => m === 0)).to.equal(true);
      const doubled = new Map([...expectedCounts(task)].map(([sku, n]) => [sku, 2 * n]));
      expect(await countsIn(redis, prefix, task)).to.deep.equal(doubled);
      expect(await markersIn(redis, prefix, task)).to.equal(task.ids.length);
    } finally {
      client.disconnect();
    }
  });

  it('a rerun of the same batch after its process died inside the crash window finds its receipt: counts exact (invariant 12)', async () => {
    const task = taskFor(runId);
    const script = `
      import { runTwoStepBatch } from ${JSON.stringify(fileURLToPath(new URL('../src/index.js', import.meta.url)))};
      import { createRedisClient } from ${JSON.stringify(import.meta.resolve('@tally/runtime'))};
      const client = createRedisClient(JSON.parse(process.env.SETTINGS).redisUrl, 'crasher');
      await runTwoStepBatch(client, JSON.parse(process.env.SETTINGS), JSON.parse(process.env.TASK), { warn() {}, error() {} }, {
        afterCountWrite: () => process.kill(process.pid, 'SIGKILL'),
      });
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      env: { ...process.env, SETTINGS: JSON.stringify(settingsFor(prefix)), TASK: JSON.stringify(task) },
      stdio: 'inherit',
    });
    expect(await new Promise((resolve) => child.on('exit', (_code, sig) => resolve(sig)))).to.equal('SIGKILL');
    expect(await markersIn(redis, prefix, task), 'died inside the window').to.equal(0);
    const client = createRedisClient(REDIS_URL, 'test');
    try {
      let hookCalls = 0;
      const rerun = await runTwoStepBatch(client, settingsFor(prefix), task, quiet, { afterCountWrite: () => void hookCalls++ });
      expect(
        [...rerun.marked].every((m) => m === 0),
        'the parts are still new',
      ).to.equal(true);
      expect(hookCalls, 'the receipt answered: nothing was written again').to.equal(0);
      expect(await countsIn(redis, prefix, task), 'counted once, not twice').to.deep.equal(expectedCounts(task));
      expect(await markersIn(redis, prefix, task)).to.equal(task.ids.length);
    } finally {
      client.disconnect();
    }
  });

  it('counts an occupation failure after a successful write, retries the markers, and does not write twice', async () => {
    const proxy = await startProxy(6379);
    const client = createRedisClient(`redis://127.0.0.1:${proxy.port}`, 'test');
    client.on('error', () => {});
    try {
      const task = taskFor(runId);
      const result = await runTwoStepBatch(client, settingsFor(prefix), task, quiet, {
        afterCountWrite: () => {
          proxy.pause();
          setTimeout(() => proxy.resume(), 400);
        },
      });
      expect(result.occupationFailures).to.equal(1);
      expect(result.writeRetries).to.equal(0);
      expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task));
      expect(await markersIn(redis, prefix, task)).to.equal(task.ids.length);
    } finally {
      client.disconnect();
      await proxy.close();
    }
  });

  it('resolves a count write whose reply was lost by its receipt, without writing twice', async () => {
    const proxy = await startProxy(6379);
    const client = createRedisClient(`redis://127.0.0.1:${proxy.port}`, 'test');
    client.on('error', () => {});
    try {
      // Warm up on another prefix so the scripts are loaded: the cut must hit
      // the count write itself, not a NOSCRIPT round.
      await runTwoStepBatch(client, settingsFor(`${prefix}warm:`), taskFor(runId, 3, 2), quiet);
      let cut = false;
      proxy.inspect = (chunk) => {
        // The count write reaches Redis and runs; its reply never arrives.
        if (!cut && chunk.toString('latin1').includes(WRITE_COUNTS.sha)) {
          cut = true;
          return 'cut-after';
        }
        return 'forward';
      };
      const task = taskFor(runId);
      const result = await runTwoStepBatch(client, settingsFor(prefix), task, quiet);
      expect(cut, 'the reply was cut').to.equal(true);
      expect(result.writeRetries, 'the write failed once').to.equal(1);
      expect(await countsIn(redis, prefix, task), 'written once, not twice').to.deep.equal(expectedCounts(task));
      expect(await markersIn(redis, prefix, task)).to.equal(task.ids.length);
    } finally {
      client.disconnect();
      await proxy.close();
    }
  });

  it('waits out a Redis outage before the write and then counts exactly once', async () => {
    const proxy = await startProxy(6379);
    const client = createRedisClient(`redis://127.0.0.1:${proxy.port}`, 'test');
    client.on('error', () => {});
    try {
      await client.ping();
      proxy.pause();
      setTimeout(() => proxy.resume(), 1_500);
      const task = taskFor(runId);
      const result = await runTwoStepBatch(client, settingsFor(prefix), task, quiet);
      expect([...result.marked].every((m) => m === 0)).to.equal(true);
      expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task));
      expect(await markersIn(redis, prefix, task)).to.equal(task.ids.length);
    } finally {
      client.disconnect();
      await proxy.close();
    }
  });

  it('never occupies markers for counts the server no longer has: counts lost between the steps (failover, restart) rerun the batch', async () => {
    // The count write lands, then the server loses it (here a restart without
    // persistence; in production a failover to a replica that never had it),
    // and the occupation's retry reaches the server without the counts.
    // Markers set there would make the batch, and its ack, look done.
    const server = await startPrivateRedis();
    const probe = new Redis(server.url, { maxRetriesPerRequest: 1 });
    probe.on('error', () => {});
    const client = createRedisClient(server.url, 'test');
    client.on('error', () => {});
    try {
      const task = taskFor(runId, 6, 20);
      let crashed = false;
      const run = runTwoStepBatch(client, settingsFor(prefix), task, quiet, {
        afterCountWrite: async () => {
          if (crashed) return;
          crashed = true;
          await server.crashAndRestart(0);
        },
      });
      const error = await run.then(
        () => null,
        (e: unknown) => e,
      );
      expect(crashed, 'the counts were written, then lost').to.equal(true);
      expect(error, 'the batch is not reported done').to.be.instanceOf(BatchWritesLostError);
      expect(await markersIn(probe, prefix, task), 'no marker stands for the lost counts').to.equal(0);
      // The coordinator's rerun: same task, same batch id.
      const rerun = await runTwoStepBatch(client, settingsFor(prefix), task, quiet);
      expect([...rerun.marked]).to.deep.equal(task.ids.map(() => 0));
      expect(await countsIn(probe, prefix, task), 'counted once, on the server that has the markers').to.deep.equal(expectedCounts(task));
      expect(await markersIn(probe, prefix, task)).to.equal(task.ids.length);
    } finally {
      client.disconnect();
      probe.disconnect();
      await server.stop();
    }
  });

  it('reloads its scripts after a Redis restart (NOSCRIPT) and loses nothing', async () => {
    // A server of the test's own: killing the shared Redis is not allowed.
    const server = await startPrivateRedis();
    const probe = new Redis(server.url, { maxRetriesPerRequest: 1 });
    probe.on('error', () => {});
    const warnings: string[] = [];
    const log: BatchLog = { warn: (_f, m) => warnings.push(m), error() {} };
    const client = createRedisClient(server.url, 'test');
    client.on('error', () => {});
    try {
      const first = taskFor(runId, 5, 10);
      await runTwoStepBatch(client, settingsFor(prefix), first, log);
      await server.crashAndRestart(0);
      const second = taskFor(`${runId}b`, 5, 10);
      await runTwoStepBatch(client, settingsFor(prefix), second, log);
      expect(
        warnings.some((w) => w.includes('lost a script')),
        'the reload was noticed',
      ).to.equal(true);
      expect(await probe.get(countKey(prefix, 5, 'S0')), 'counted on the restarted server').to.not.equal(null);
      expect(await markersIn(probe, prefix, second), 'every marker occupied on the restarted server').to.equal(second.ids.length);
    } finally {
      client.disconnect();
      probe.disconnect();
      await server.stop();
    }
  });

  it('a second daemon holds back a part another daemon has claimed, and finds it done afterwards: counted once', async () => {
    const a = createRedisClient(REDIS_URL, 'test-a');
    const b = createRedisClient(REDIS_URL, 'test-b');
    try {
      const task = taskFor(runId, 7, 40);
      let during: Uint8Array | null = null;
      // Daemon B runs the same parts while A is inside its crash window (counts written, markers not).
      const first = await runTwoStepBatch(a, settingsFor(prefix, { claimToken: 'a1' }), task, quiet, {
        afterCountWrite: async () => {
          during = (await runTwoStepBatch(b, settingsFor(prefix, { claimToken: 'b2' }), task, quiet)).marked;
        },
      });
      expect([...first.marked]).to.deep.equal(task.ids.map(() => 0));
      expect([...during!], 'held by A’s live claims').to.deep.equal(task.ids.map(() => 2));
      const after = await runTwoStepBatch(b, settingsFor(prefix, { claimToken: 'b2' }), task, quiet);
      expect([...after.marked], 'done once A occupied them').to.deep.equal(task.ids.map(() => 1));
      expect(await countsIn(redis, prefix, task), 'counted once').to.deep.equal(expectedCounts(task));
    } finally {
      a.disconnect();
      b.disconnect();
    }
  });

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: catches a duplicate across bucket boundaries for at least the marker TTL, then lets the markers expire`, async function () {
      this.timeout(30_000);
      const run = mode === 'atomic' ? runAtomicBatch : runTwoStepBatch;
      // A 2 s TTL in 1 s buckets: every check below crosses a bucket boundary.
      const settings = settingsFor(prefix, { mode, markerTtlS: 2, markerBucketS: 1 });
      const client = createRedisClient(REDIS_URL, 'test-ttl');
      try {
        const task = taskFor(`${runId}-${mode}`, 11, 30);
        const first = await run(client, settings, task, quiet);
        const markedAt = performance.now();
        const firstBucket = Math.floor(Number((await redis.time())[0]) / settings.markerBucketS);
        expect([...first.marked]).to.deep.equal(task.ids.map(() => 0));
        let checks = 0;
        // Until just under the TTL after the markers were written, every copy is a duplicate.
        while (performance.now() - markedAt < 1_850) {
          // A copy is a new batch (a new batch id): the same id would be answered by the first run's receipt.
          const again = await run(client, settings, redelivered(task), quiet);
          if (performance.now() - markedAt >= 2_000) break; // the check itself ran past the TTL: not evidence either way
          expect([...again.marked], `a duplicate ${Math.round(performance.now() - markedAt)} ms after`).to.deep.equal(task.ids.map(() => 1));
          checks++;
          await new Promise((resolve) => setTimeout(resolve, 150));
        }
        expect(checks, 'checked across the TTL').to.be.at.least(5);
        expect(await countsIn(redis, prefix, task), 'counted once').to.deep.equal(expectedCounts(task));
        // A marker lives at most one bucket width past the TTL: after that the same id counts again.
        await new Promise((resolve) => setTimeout(resolve, Math.max(0, 3_300 - (performance.now() - markedAt))));
        const expired = await run(client, settings, redelivered(task), quiet);
        expect([...expired.marked], 'markers expired with their buckets').to.deep.equal(task.ids.map(() => 0));
        // The expired buckets are gone, hashes and meta alike: every key left is in a bucket still live by the server's clock.
        const oldestLive = Math.floor((Number((await redis.time())[0]) - settings.markerTtlS) / settings.markerBucketS);
        const bucketsLeft = (await redis.keys(`${prefix}mk:*`)).map((key) => Number(key.split(':').at(-2)));
        expect(bucketsLeft.length, 'the last run wrote markers').to.be.greaterThan(0);
        expect(
          bucketsLeft.filter((bucket) => bucket < oldestLive),
          'keys of expired buckets',
        ).to.deep.equal([]);
        expect(bucketsLeft, "the first run's bucket expired").to.not.include(firstBucket);
      } finally {
        client.disconnect();
      }
    });
  }

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: sizes each bucket's sub-buckets from the bucket before, and finds markers across buckets of different sizes`, async function () {
      this.timeout(30_000);
      const run = mode === 'atomic' ? runAtomicBatch : runTwoStepBatch;
      const settings = settingsFor(prefix, { mode, markerTtlS: 6, markerBucketS: 2, markerSubBuckets: 16 });
      const client = createRedisClient(REDIS_URL, 'test-subs');
      try {
        const bucketNow = async () => bucketOf(Number((await redis.time())[0]), settings.markerBucketS);
        // Start right after a bucket boundary, so both batches below land in consecutive buckets.
        const start = await bucketNow();
        while ((await bucketNow()) === start) await new Promise((resolve) => setTimeout(resolve, 20));
        const big = taskFor(`${runId}-${mode}-big`, 4, 700);
        await run(client, settings, big, quiet);
        const first = await bucketNow();
        expect(await redis.hget(markerMetaKey(prefix, 4, first), 's'), 'first bucket: the initial count').to.equal('16');
        expect(await redis.hget(markerMetaKey(prefix, 4, first), 'n')).to.equal('700');
        while ((await bucketNow()) === first) await new Promise((resolve) => setTimeout(resolve, 20));
        const small = taskFor(`${runId}-${mode}-small`, 4, 10);
        await run(client, settings, small, quiet);
        const second = await bucketNow();
        expect(second, 'the next bucket').to.equal(first + 1);
        expect(Number(await redis.hget(markerMetaKey(prefix, 4, second), 's')), 'sized for 700 markers').to.equal(subBucketsAfter(700, 16));
        expect(subBucketsAfter(700, 16)).to.equal(16); // 700 / 64 -> 16: same as the initial here; the third bucket shrinks
        while ((await bucketNow()) === second) await new Promise((resolve) => setTimeout(resolve, 20));
        const tiny = taskFor(`${runId}-${mode}-tiny`, 4, 3);
        await run(client, settings, tiny, quiet);
        expect(await redis.hget(markerMetaKey(prefix, 4, second + 1), 's'), 'sized for 10 markers').to.equal('1');
        // Every marker of the three buckets is still found: copies of all three batches are duplicates.
        for (const task of [big, small, tiny]) {
          const again = await run(client, settings, redelivered(task), quiet);
          expect(
            [...again.marked].every((m) => m === 1),
            `${task.ids[0]} found again`,
          ).to.equal(true);
        }
        const listpacks = await readMarkers(redis, prefix);
        expect(listpacks.done.size).to.equal(713);
        // Every marker hash and meta hash carries its expiry (set once, when the hash was created).
        const keys = await redis.keys(`${prefix}mk:*`);
        expect(keys.length).to.be.greaterThan(3);
        for (const key of keys) expect(await redis.ttl(key), key).to.be.within(1, 8);
      } finally {
        client.disconnect();
      }
    });
  }

  it('moves the markers to the bucket of now when the occupation comes a bucket after the claim, so they live the TTL from then', async function () {
    this.timeout(20_000);
    const settings = settingsFor(prefix, { markerTtlS: 4, markerBucketS: 2 });
    const client = createRedisClient(REDIS_URL, 'test-move');
    try {
      const bucketNow = async () => bucketOf(Number((await redis.time())[0]), settings.markerBucketS);
      const task = taskFor(`${runId}-move`, 6, 25);
      let claimedIn = -1;
      await runTwoStepBatch(client, settings, task, quiet, {
        // Inside the window: wait for the next bucket before the occupation runs.
        afterCountWrite: async () => {
          claimedIn = await bucketNow();
          while ((await bucketNow()) === claimedIn) await new Promise((resolve) => setTimeout(resolve, 20));
        },
      });
      const occupiedIn = await bucketNow();
      expect(occupiedIn, 'occupied a bucket later').to.be.greaterThan(claimedIn);
      // Every marker is done, and written as done to the later bucket's hashes.
      expect(await markersIn(redis, prefix, task)).to.equal(task.ids.length);
      const subs = Number(await redis.hget(markerMetaKey(prefix, 6, occupiedIn), 's'));
      const digest = markerDigest(task.ids[0]!);
      const later = markerBucketKey(prefix, 6, occupiedIn, subBucketOf(digest, subs));
      expect(await redis.hget(later, digest as unknown as string)).to.equal('1');
      // It expires at the later bucket's end plus the TTL: at least the TTL after the occupation.
      const [nowS, nowUs] = await redis.time();
      const expiresAtMs = Number(nowS) * 1000 + Number(nowUs) / 1000 + (await redis.pttl(later));
      expect(expiresAtMs, 'the later bucket lives the TTL from its end').to.be.closeTo(((occupiedIn + 1) * 2 + 4) * 1000, 50);
      const again = await runTwoStepBatch(client, settings, redelivered(task), quiet);
      expect([...again.marked]).to.deep.equal(task.ids.map(() => 1));
      expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task));
    } finally {
      client.disconnect();
    }
  });

  it('ends a claim whose new parts were all refused, a bucket after it was made: its record turns done and the refused claims go', async () => {
    // Nothing to move to the bucket of now: the first call must still end the batch (it used to answer -1 and write nothing, twice).
    const [seconds] = await redis.time();
    const claimed = bucketOf(Number(seconds), 10) - 1;
    const base = markerBaseKey(prefix, 5);
    const digest = randomBytes(16);
    await redis.hset(`${base}:${claimed}:m`, 's', 1, 'b7', `ca1:${Number(seconds) * 1000}`);
    await redis.hset(`${base}:${claimed}:0`, digest, '7');
    const reply = await runScript(redis, OCCUPY_MARKERS, evalshaArgs(OCCUPY_MARKERS, [base], [10, 20, 1, 12, claimed, 7, 1, digest]), quiet);
    expect(reply).to.equal(ScriptReply.OCCUPY_NEEDS_DIGESTS);
    expect(await redis.hget(`${base}:${claimed}:m`, 'b7'), 'the batch is done').to.equal('1');
    expect(await redis.hexists(`${base}:${claimed}:0`, digest), 'the refused claim is deleted').to.equal(0);
  });

  it("deletes a refused part's claim only while it is the batch's own: one taken over since is left to its new owner", async () => {
    // Before, the field was deleted whatever it held: a batch that stalled past the claim TTL, then found a part
    // refused, deleted the claim another daemon had taken over and counted; that part was left without a marker.
    const [seconds] = await redis.time();
    const claimed = bucketOf(Number(seconds), 10) - 1;
    const base = markerBaseKey(prefix, 6);
    const [ours, takenOver] = [randomBytes(16), randomBytes(16)];
    await redis.hset(`${base}:${claimed}:m`, 's', 1, 'b7', `ca1:${Number(seconds) * 1000}`, 'b8', `cb2:${Number(seconds) * 1000}`);
    await redis.hset(`${base}:${claimed}:0`, ours, '7', takenOver, '8');
    await runScript(redis, OCCUPY_MARKERS, evalshaArgs(OCCUPY_MARKERS, [base], [10, 20, 1, 12, claimed, 7, 2, ours, takenOver]), quiet);
    expect(await redis.hexists(`${base}:${claimed}:0`, ours), 'its own refused claim is deleted').to.equal(0);
    expect(await redis.hget(`${base}:${claimed}:0`, takenOver), "the other daemon's claim stays").to.equal('8');
    // A claim pipeline's claims hold its id (native-claims.ts): the same rule.
    const [pipelined, pipelinedOver] = [randomBytes(16), randomBytes(16)];
    await redis.hset(`${base}:${claimed}:0`, pipelined, 'nAbc1', pipelinedOver, '9');
    await runScript(redis, OCCUPY_MARKERS, evalshaArgs(OCCUPY_MARKERS, [base], [10, 20, 1, 12, claimed, 'nAbc1', 2, pipelined, pipelinedOver]), quiet);
    expect(await redis.hexists(`${base}:${claimed}:0`, pipelined), "the pipeline's own refused claim is deleted").to.equal(0);
    expect(await redis.hget(`${base}:${claimed}:0`, pipelinedOver), 'the claim taken over from it stays').to.equal('9');
  });

  it('gives a marker hash its expiry again when a refused claim emptied it and a later claim recreates it', async () => {
    // The meta's `x` says which hashes carry their expiry; a hash the deletion of refused claims empties is gone with its
    // TTL, and the claim that recreates it must set one again (a marker hash without expiry would never leave Redis).
    const settings = settingsFor(prefix);
    let nowS = Number((await redis.time())[0]);
    // Claim and deletion in one bucket: not in the bucket's last seconds.
    if (nowS % 300 > 290) await new Promise((resolve) => setTimeout(resolve, (301 - (nowS % 300)) * 1000));
    nowS = Number((await redis.time())[0]);
    const current = bucketOf(nowS, 300);
    const base = markerBaseKey(prefix, 5);
    const meta = `${base}:${current}:m`;
    const hash = `${base}:${current}:0`;
    const digest = randomBytes(16);
    await redis.hset(meta, 's', 1, 'x', Buffer.from([1]), 'b7', `ca1:${nowS * 1000}`);
    await redis.hset(hash, digest, '7');
    await redis.expire(meta, 900);
    await redis.expire(hash, 900);
    const reply = await runScript(redis, OCCUPY_MARKERS, evalshaArgs(OCCUPY_MARKERS, [base], [300, settings.markerTtlS, 1, 0, current, 7, 1, digest]), quiet);
    expect(reply).to.equal(0);
    expect(await redis.exists(hash), 'the deletion emptied the hash').to.equal(0);
    const client = createRedisClient(REDIS_URL, 'test-emptied');
    try {
      const task = taskFor(`${runId}-emptied`, 5, 20);
      expect([...(await runTwoStepBatch(client, settings, task, quiet)).marked]).to.deep.equal(task.ids.map(() => 0));
      expect(await redis.hlen(hash), 'the claim recreated the hash').to.equal(20);
      expect(await redis.ttl(hash), 'the recreated hash expires').to.be.greaterThan(0);
    } finally {
      client.disconnect();
    }
  });
});
