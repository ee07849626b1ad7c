import { spawn } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, markerKey, type BatchTask, type WorkerSettings } from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import type { BatchLog } from '../src/batch-log.js';
import { BatchWritesLostError } from '../src/replica-wait.js';
import { runTwoStepBatch, WRITE_COUNTS } from '../src/two-step-batch.js';
import { startPrivateRedis, startProxy } from '@tally/testkit';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const quiet: BatchLog = process.env.TEST_VERBOSE
  ? { warn: (f, m) => console.log(Date.now() % 100000, m, JSON.stringify(f)), error: (f, m) => console.log(m, f) }
  : { warn() {}, error() {} };

function settingsFor(prefix: string): WorkerSettings {
  return { redisUrl: REDIS_URL, prefix, mode: 'two-step', markerTtlS: 600, countTtlS: 2_592_000, logLevel: 'silent', waitReplicas: 0, waitTimeoutMs: 1000 };
}

function taskFor(runId: string, vshard = 3, parts = 50): BatchTask {
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

function expectedCounts(task: BatchTask): Map<string, number> {
  const sums = new Map<string, number>();
  for (const part of task.changes) for (const [sku, delta] of part) sums.set(sku, (sums.get(sku) ?? 0) + delta);
  return sums;
}

async function countsIn(redis: Redis, prefix: string, task: BatchTask): Promise<Map<string, number>> {
  const result = new Map<string, number>();
  for (const sku of expectedCounts(task).keys()) result.set(sku, Number(await redis.get(countKey(prefix, task.vshard, sku))));
  return result;
}

async function markersIn(redis: Redis, prefix: string, task: BatchTask): Promise<number> {
  const values = await redis.mget(task.ids.map((id) => markerKey(prefix, task.vshard, id)));
  return values.filter((v) => v !== null).length;
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
      const ttl = await redis.ttl(markerKey(prefix, task.vshard, task.ids[0]!));
      expect(ttl).to.be.within(590, 600);
      expect(await redis.ttl(countKey(prefix, task.vshard, 'S0'))).to.be.greaterThan(2_500_000);

      const second = await runTwoStepBatch(client, settingsFor(prefix), redelivered(task), quiet);
      expect([...second.marked]).to.deep.equal(task.ids.map(() => 1));
      expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task));
    } finally {
      client.disconnect();
    }
  });

  it('writes the counts before it occupies any marker (invariant 2, seen by MONITOR)', async () => {
    const monitor = await new Redis(REDIS_URL).monitor();
    const seen: string[] = [];
    // MONITOR also shows the commands a script runs, in the order Redis ran them.
    monitor.on('monitor', (_time: string, args: string[]) => {
      if (args[0] && args[1]?.startsWith(prefix)) seen.push(`${args[0].toLowerCase()} ${args[1]}`);
    });
    const client = createRedisClient(REDIS_URL, 'test');
    try {
      const task = taskFor(runId);
      await runTwoStepBatch(client, settingsFor(prefix), task, quiet);
      await new Promise((resolve) => setTimeout(resolve, 200));
      const firstMarkerSet = seen.findIndex((line) => line.startsWith(`set ${prefix}m:`));
      const lastIncr = seen.map((line) => line.startsWith('incrby ')).lastIndexOf(true);
      const receipt = seen.findIndex((line) => line.startsWith(`set ${prefix}w:`));
      expect(firstMarkerSet, 'markers were set').to.be.greaterThan(-1);
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

    // The redelivery (a new batch of a new daemon) finds no marker and counts again: double, never zero.
    const client = createRedisClient(REDIS_URL, 'test');
    try {
      const redelivery = await runTwoStepBatch(client, settingsFor(prefix), redelivered(task), quiet);
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
      expect(await probe.mget(second.ids.map((id) => markerKey(prefix, 5, id)))).to.deep.equal(second.ids.map(() => '1'));
    } finally {
      client.disconnect();
      probe.disconnect();
      await server.stop();
    }
  });
});
