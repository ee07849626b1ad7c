import { hostname } from 'node:os';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { daemonKey } from '@tally/shared';
import type { StatusReport } from '../../src/commands/status.js';
import { HEARTBEAT_TTL_MS, TALLY_VERSION } from '../../src/fleet/heartbeat.js';
import { cleanup, killDaemon, startDaemon, stopDaemon, testSpace, withRedis, AMQP_URL } from './harness.js';
import { tallyCli, until } from './fleet-helpers.js';

async function status(env: Record<string, string>): Promise<StatusReport> {
  const result = await tallyCli(env, 'status', '--json');
  expect(result.code, result.stderr).to.equal(0);
  return JSON.parse(result.stdout) as StatusReport;
}

describe('heartbeats and tally status (integration)', function () {
  this.timeout(120_000);

  it('reports a prefix nobody started on as an empty list, exit 0, in JSON and as text', async () => {
    const space = testSpace('status-empty');
    const report = await status(space.env);
    expect(report.daemons).to.deep.equal([]);
    expect(report.layout).to.equal(null);
    expect(report.queue.exists).to.equal(false);
    const text = await tallyCli(space.env, 'status');
    expect(text.code).to.equal(0);
    expect(text.stdout).to.include('0 live');
    expect(text.stdout).to.include('no layout');
  });

  it('lists live daemons with what they are doing; a clean stop removes the heartbeat, a SIGKILLed one lingers at most its TTL', async () => {
    // Batches that never fill and never time out: the deliveries stay unacked, so the oldest unacked age grows.
    const space = testSpace('status', { TALLY_WORKERS: '1', TALLY_BATCH_SIZE: '10000', TALLY_BATCH_WAIT_MS: '60000', TALLY_PREFETCH: '1000' });
    try {
      const workload = generateWorkload({ messages: 20, skus: 5, seed: 3, duplicateRate: 0, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const first = await startDaemon(space.env);
      const second = await startDaemon({ ...space.env, TALLY_BATCH_WAIT_MS: '50' });
      const report = await until(
        'a beat showing unacked deliveries',
        async () => {
          const r = await status(space.env);
          const busy = r.daemons.find((d) => d.pid === first.child.pid);
          return r.daemons.length === 2 && busy !== undefined && busy.in_flight > 0 && (busy.oldest_unacked_s ?? 0) >= 1 ? r : undefined;
        },
        30_000,
        500,
      );
      expect(report.layout).to.deep.include({ virtual_shards: 16, mode: 'two-step' });
      expect(report.queue).to.deep.include({ name: space.queue, exists: true, consumers: 2 });
      expect(report.daemons.map((d) => d.pid).sort()).to.deep.equal([first.child.pid, second.child.pid].sort());
      for (const d of report.daemons) {
        expect(d).to.include({ host: hostname(), mode: 'two-step', version: TALLY_VERSION, queue: space.queue, consuming: true });
        expect(TALLY_VERSION).to.match(/^\d+\.\d+\.\d+/);
        expect(d.last_beat_age_s).to.be.within(0, HEARTBEAT_TTL_MS / 1000);
        expect(Date.parse(d.started_at)).to.be.greaterThan(0);
      }
      const text = await tallyCli(space.env, 'status');
      expect(text.stdout).to.include('2 live');
      expect(text.stdout).to.match(new RegExp(`${hostname()}\\s+${first.child.pid}\\s+two-step`));

      // Clean stop: the heartbeat goes at once.
      expect((await stopDaemon(first)).code).to.equal(0);
      const afterStop = await status(space.env);
      expect(afterStop.daemons.map((d) => d.pid)).to.deep.equal([second.child.pid]);

      // A crash leaves the key to expire: listed for at most the TTL.
      const id = JSON.parse(second.logs.find((l) => l.includes('shard layout verified'))!).daemonId as string;
      await killDaemon(second);
      const pttl = await withRedis((redis) => redis.pttl(daemonKey(space.prefix, id)));
      expect(pttl).to.be.within(1, HEARTBEAT_TTL_MS);
    } finally {
      await cleanup(space);
    }
  });
});
