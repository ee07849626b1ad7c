import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { FILTERED_MARKER_FORMAT, layoutKey, legacyMarkerKey, isTallyError, SHARD_HASH, type TallyMode } from '@tally/shared';
import { ensureLayout, type Layout } from '../../src/fleet/layout-guard.js';
import { cleanup, REDIS_URL, spawnDaemon, stopDaemon, testSpace, withRedis, type DaemonProcess } from './harness.js';

interface Settings {
  readonly virtualShards: number;
  readonly mode: TallyMode;
}

const CONFLICTING: readonly Settings[] = [
  { virtualShards: 16, mode: 'two-step' },
  { virtualShards: 16, mode: 'atomic' },
  { virtualShards: 32, mode: 'two-step' },
];

function same(a: Settings, b: Settings): boolean {
  return a.virtualShards === b.virtualShards && a.mode === b.mode;
}

/** The refusal a loser must give, knowing the winner's settings. */
function expectedCode(winner: Settings, loser: Settings): string {
  return winner.virtualShards !== loser.virtualShards ? 'TALLY_SHARD_LAYOUT_MISMATCH' : 'TALLY_MODE_MISMATCH';
}

async function connected(count: number): Promise<Redis[]> {
  const clients = Array.from({ length: count }, () => new Redis(REDIS_URL, { lazyConnect: true }));
  await Promise.all(clients.map((c) => c.connect()));
  return clients;
}

describe('layout and mode check (integration: daemons racing on a new prefix)', function () {
  this.timeout(180_000);

  it('lets exactly one layout win among concurrent starts with conflicting settings; every other setting is refused with its code', async () => {
    const rounds = 12;
    const callers = 6;
    const clients = await connected(callers);
    const prefixes: string[] = [];
    try {
      for (let round = 0; round < rounds; round++) {
        const prefix = `${testSpace('race').prefix}`;
        prefixes.push(prefix);
        // Rotate which settings come first so no one combination always wins the race.
        const settings = Array.from({ length: callers }, (_, i) => CONFLICTING[(i + round) % CONFLICTING.length]!);
        const outcomes = await Promise.allSettled(
          settings.map((s, i) => ensureLayout(clients[i]!, { prefix, ...s }, { holder: `caller-${i}`, ttlMs: 30_000 })),
        );
        const stored = await clients[0]!.hgetall(layoutKey(prefix));
        const winner: Settings = { virtualShards: Number(stored.virtual_shards), mode: stored.mode as TallyMode };
        expect(
          CONFLICTING.some((s) => same(s, winner)),
          `round ${round}: stored layout ${JSON.stringify(stored)} is one caller's`,
        ).to.equal(true);
        let created = 0;
        for (let i = 0; i < callers; i++) {
          const outcome = outcomes[i]!;
          const mine = settings[i]!;
          if (same(mine, winner)) {
            // Same settings as the winner: every such start succeeds.
            expect(outcome.status, `round ${round}: caller ${i} with the winning settings`).to.equal('fulfilled');
            const layout = (outcome as PromiseFulfilledResult<Layout>).value;
            expect(layout.switchedFrom, 'nobody switched a new prefix').to.equal(null);
            if (layout.created) created++;
          } else {
            expect(outcome.status, `round ${round}: caller ${i} ${JSON.stringify(mine)} against ${JSON.stringify(winner)}`).to.equal('rejected');
            const error = (outcome as PromiseRejectedResult).reason;
            expect(isTallyError(error), String(error)).to.equal(true);
            expect(error.code).to.equal(expectedCode(winner, mine));
          }
        }
        expect(created, `round ${round}: exactly one creator`).to.equal(1);
        // The record still says what the winners were told.
        const after = await clients[0]!.hgetall(layoutKey(prefix));
        expect([after.virtual_shards, after.mode]).to.deep.equal([String(winner.virtualShards), winner.mode]);
      }
    } finally {
      await Promise.all(prefixes.map((prefix) => clients[0]!.del(layoutKey(prefix))));
      for (const client of clients) client.disconnect();
    }
  });

  it('refuses a mode switch while a daemon of the recorded mode holds a live lease, markers or not, and allows it once the lease ran out', async () => {
    const space = testSpace('lease');
    try {
      await withRedis(async (redis) => {
        await ensureLayout(redis, { prefix: space.prefix, virtualShards: 16, mode: 'atomic' }, { holder: 'a', ttlMs: 800 });
        // A new prefix has no marker yet: only the lease tells that an atomic daemon is starting.
        const refused = await ensureLayout(redis, { prefix: space.prefix, virtualShards: 16, mode: 'two-step' }, { holder: 'b', ttlMs: 800 }).then(
          () => null,
          (error: unknown) => error,
        );
        expect(refused, 'switch refused').to.not.equal(null);
        expect((refused as { code: string }).code).to.equal('TALLY_MODE_MISMATCH');
        expect((refused as Error).message).to.match(/live lease/);
        expect(await redis.hget(layoutKey(space.prefix), 'mode')).to.equal('atomic');
        await sleep(1_000);
        const switched = await ensureLayout(redis, { prefix: space.prefix, virtualShards: 16, mode: 'two-step' }, { holder: 'b', ttlMs: 800 });
        expect(switched.switchedFrom).to.equal('atomic');
        expect(await redis.hget(layoutKey(space.prefix), 'mode')).to.equal('two-step');
        // The expired lease was cleaned up by the script; the new one is there.
        const fields = Object.keys(await redis.hgetall(layoutKey(space.prefix))).filter((f) => f.startsWith('lease:'));
        expect(fields).to.deep.equal(['lease:b']);
      });
    } finally {
      await cleanup(space);
    }
  });

  it('records the marker format on a new prefix; refuses an old layout while legacy markers are live, and records it once they are gone', async () => {
    const space = testSpace('marker-format');
    const old = testSpace('marker-legacy');
    try {
      await withRedis(async (redis) => {
        const fresh = await ensureLayout(redis, { prefix: space.prefix, virtualShards: 16, mode: 'two-step', markerTtlS: 600, markerSubBuckets: 64 });
        expect(fresh.markers).to.deep.equal({ format: FILTERED_MARKER_FORMAT, scope: 'part', bucketS: 300, subBuckets: 64 });
        // A later daemon with other marker settings adopts what the prefix recorded.
        const later = await ensureLayout(redis, { prefix: space.prefix, virtualShards: 16, mode: 'two-step', markerTtlS: 60, markerSubBuckets: 1024 });
        expect(later.markers).to.deep.equal({ format: FILTERED_MARKER_FORMAT, scope: 'part', bucketS: 300, subBuckets: 64 });

        // A prefix laid out by an older Tally: no marker_format, and a live key-per-marker marker.
        await redis.hset(layoutKey(old.prefix), 'virtual_shards', '16', 'hash', SHARD_HASH, 'mode', 'two-step', 'created_at', 'then');
        await redis.set(legacyMarkerKey(old.prefix, 3, 'msg-1'), '1', 'EX', 600);
        const refused = await ensureLayout(redis, { prefix: old.prefix, virtualShards: 16, mode: 'two-step' }).then(
          () => null,
          (error: unknown) => error,
        );
        expect(isTallyError(refused) && refused.code, String(refused)).to.equal('TALLY_MARKER_FORMAT');
        expect((refused as Error).message).to.include(legacyMarkerKey(old.prefix, 3, 'msg-1'));
        expect((refused as Error).message.split('\n')).to.have.length(1);
        expect(await redis.hget(layoutKey(old.prefix), 'marker_format'), 'nothing recorded').to.equal(null);
        await redis.del(legacyMarkerKey(old.prefix, 3, 'msg-1'));
        const upgraded = await ensureLayout(redis, { prefix: old.prefix, virtualShards: 16, mode: 'two-step' });
        expect(upgraded.markers.format).to.equal(FILTERED_MARKER_FORMAT);
        expect(await redis.hget(layoutKey(old.prefix), 'marker_format')).to.equal(FILTERED_MARKER_FORMAT);

        // A format this build does not know (a newer build's) is refused too.
        await redis.hset(layoutKey(old.prefix), 'marker_format', 'from-the-future');
        const unknown = await ensureLayout(redis, { prefix: old.prefix, virtualShards: 16, mode: 'two-step' }).then(
          () => null,
          (error: unknown) => error,
        );
        expect(isTallyError(unknown) && unknown.code).to.equal('TALLY_MARKER_FORMAT');
      });
    } finally {
      await cleanup(space);
      await cleanup(old);
    }
  });

  it('six daemon processes started at once with conflicting settings: one setting starts, the others exit 1 naming their code', async () => {
    const space = testSpace('race-procs', { TALLY_WORKERS: '1', TALLY_PREFETCH: '50' });
    const daemons: Array<{ settings: Settings; daemon: DaemonProcess }> = [];
    try {
      for (let i = 0; i < 6; i++) {
        const settings = CONFLICTING[i % CONFLICTING.length]!;
        const env = { ...space.env, TALLY_VIRTUAL_SHARDS: String(settings.virtualShards), TALLY_MODE: settings.mode };
        daemons.push({ settings, daemon: spawnDaemon(env) });
      }
      // Each either reaches "consuming" or exits.
      await Promise.all(
        daemons.map(async ({ daemon }) => {
          const deadline = Date.now() + 60_000;
          while (Date.now() < deadline && daemon.child.exitCode === null && !daemon.logs.some((l) => l.includes('"msg":"consuming"'))) await sleep(50);
        }),
      );
      const stored = await withRedis((redis) => redis.hgetall(layoutKey(space.prefix)));
      const winner: Settings = { virtualShards: Number(stored.virtual_shards), mode: stored.mode as TallyMode };
      let running = 0;
      for (const { settings, daemon } of daemons) {
        if (same(settings, winner)) {
          expect(daemon.child.exitCode, `a ${JSON.stringify(settings)} daemon runs; stderr ${daemon.stderr.join('')}`).to.equal(null);
          expect(daemon.logs.some((l) => l.includes('"msg":"consuming"'))).to.equal(true);
          running++;
        } else {
          const exit = await daemon.exited;
          expect(exit.code, `a ${JSON.stringify(settings)} daemon is refused`).to.equal(1);
          expect(daemon.stderr.join('').trim().split('\n'), 'one stderr line').to.have.length(1);
          const code = expectedCode(winner, settings);
          expect(
            daemon.logs.some((l) => l.includes(`"code":"${code}"`)),
            `logs ${code}`,
          ).to.equal(true);
        }
      }
      expect(running, 'both daemons with the winning settings run').to.equal(2);
      for (const { daemon } of daemons) expect((await stopDaemon(daemon)).code).to.be.oneOf([0, 1]);
      // Clean stops release the leases and remove the heartbeats.
      const fields = Object.keys(await withRedis((redis) => redis.hgetall(layoutKey(space.prefix))));
      expect(
        fields.filter((f) => f.startsWith('lease:')),
        'leases released',
      ).to.deep.equal([]);
    } finally {
      for (const { daemon } of daemons) if (daemon.child.exitCode === null && daemon.child.signalCode === null) daemon.child.kill('SIGKILL');
      await cleanup(space);
    }
  });
});
