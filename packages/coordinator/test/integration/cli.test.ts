import { mkdtemp, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'chai';
import { countKey, shardOf, statsKey } from '@tally/shared';
import { pinMarkerScope, cleanup, drainWithDaemon, testSpace, withRedis } from './harness.js';
import { startPrivateRedis } from '@tally/testkit';
import { tallyCli } from './fleet-helpers.js';

describe('tally CLI (integration)', function () {
  // It reads part-scoped markers, claims or windows by shard from Redis.
  pinMarkerScope('part');
  this.timeout(120_000);

  it('counts --json prints every SKU under the prefix exactly, and --sku limits it', async () => {
    const space = testSpace('cli');
    try {
      await withRedis(async (redis) => {
        const skus = ['A-1', 'weird } sku:{x}', 'ünï', 'BIG'];
        await redis.set(countKey(space.prefix, shardOf('A-1', 16), 'A-1'), '5');
        await redis.set(countKey(space.prefix, shardOf(skus[1]!, 16), skus[1]!), '-3');
        await redis.set(countKey(space.prefix, shardOf('ünï', 16), 'ünï'), '12');
        await redis.set(countKey(space.prefix, shardOf('BIG', 16), 'BIG'), '9007199254740993');
        await redis.set(`${space.prefix}m:{1}:not-a-count`, '1');
        await redis.hset(statsKey(space.prefix), 'received', '7', 'duplicates', '2');
      });
      const all = await tallyCli(space.env, 'counts', '--json');
      expect(all.code).to.equal(0);
      expect(all.stdout.trim()).to.equal('{"A-1":5,"BIG":9007199254740993,"weird } sku:{x}":-3,"ünï":12}');
      const some = await tallyCli(space.env, 'counts', '--json', '--sku', 'A-1', '--sku', 'nope');
      expect(JSON.parse(some.stdout)).to.deep.equal({ 'A-1': 5 });
      const stats = JSON.parse((await tallyCli(space.env, 'stats', '--json')).stdout);
      expect(stats.received).to.equal(7);
      expect(stats.duplicates).to.equal(2);
      expect(stats.occupation_failures, 'every counter is present').to.equal(0);
    } finally {
      await cleanup(space);
    }
  });

  it('a Redis that accepts the connection and never answers (SIGSTOP): each command fails naming the server and what to check', async () => {
    // ioredis's own words were "Command timed out": no server, no cause, no next step.
    const server = await startPrivateRedis({ password: 'cli-secret' });
    const space = testSpace('cli-unanswered');
    try {
      server.signal('SIGSTOP');
      const env = { ...space.env, TALLY_REDIS_URL: `redis://:cli-secret@127.0.0.1:${server.port}` };
      const [counts, status] = await Promise.all([tallyCli(env, 'counts', '--json'), tallyCli(env, 'status')]);
      for (const result of [counts, status]) {
        expect(result.code).to.equal(1);
        expect(result.stdout).to.equal('');
        expect(result.stderr).to.include(`Redis (redis://:***@127.0.0.1:${server.port}) accepted the connection but did not answer within 10 s`);
        expect(result.stderr).to.include('redis-cli PING');
        expect(result.stderr, 'never the password').not.to.include('cli-secret');
      }
    } finally {
      server.signal('SIGCONT');
      await server.stop();
    }
  });

  it('publish writes a truth file that verify checks against what the daemon counted', async () => {
    const space = testSpace('cli-pub');
    try {
      const dir = await mkdtemp(join(tmpdir(), 'tally-'));
      const truthFile = join(dir, 'truth.json');
      const published = await tallyCli(
        space.env,
        'publish',
        '--messages',
        '500',
        '--skus',
        '50',
        '--duplicate-rate',
        '0.1',
        '--bad-rate',
        '0.02',
        '--seed',
        '3',
        '--truth',
        truthFile,
      );
      expect(published.code, published.stderr).to.equal(0);
      const summary = JSON.parse(published.stdout);
      expect(summary).to.include({ published: 560, good: 500, duplicates: 50, bad: 10 });
      expect(JSON.parse(await readFile(truthFile, 'utf8')).counts).to.be.an('object');
      await drainWithDaemon(space.env, space.queue);
      const verdict = await tallyCli(space.env, 'verify', '--truth', truthFile, '--exact', '--json');
      expect(verdict.code).to.equal(0);
      expect(JSON.parse(verdict.stdout)).to.include({ below: 0, above: 0 });
      // A lost unit is caught: lower one count and verify fails.
      const sku = Object.keys(JSON.parse(await readFile(truthFile, 'utf8')).counts)[0]!;
      await withRedis((redis) => redis.decrby(countKey(space.prefix, shardOf(sku, 16), sku), 1));
      const broken = await tallyCli(space.env, 'verify', '--truth', truthFile);
      expect(broken.code).to.equal(1);
      expect(broken.stdout).to.include('1 below the truth');
    } finally {
      await cleanup(space);
    }
  });

  it('rejects bad usage with exit 64 and bad configuration naming the variable', async () => {
    const usage = await tallyCli({}, 'frobnicate');
    expect(usage.code).to.equal(64);
    expect(usage.stderr).to.include('unknown command');
    const flag = await tallyCli({}, 'publish', '--messages', 'many');
    expect(flag.code).to.equal(64);
    expect(flag.stderr).to.include('--messages');
    const config = await tallyCli({ TALLY_PREFIX: 'bad*prefix' }, 'counts', '--json');
    expect(config.code).to.not.equal(0);
    expect(config.stderr).to.include('TALLY_PREFIX');
  });
});
