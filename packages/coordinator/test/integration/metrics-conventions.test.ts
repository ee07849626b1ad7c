import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { startProxy } from '@tally/testkit';
import { cleanup, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';
import { requireTool, runTool } from './ops-tools.js';

async function metricsText(port: number): Promise<string> {
  return (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
}

/** The value of one sample line, labels ignored (the first match). */
function sample(text: string, name: string): number | undefined {
  const match = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text);
  return match ? Number(match[1]) : undefined;
}

describe('metrics follow the Prometheus conventions (integration: promtool check metrics on a live /metrics)', function () {
  this.timeout(180_000);

  it('passes promtool check metrics with no warning, names base units, says service_name="tally", binds to loopback by default', async () => {
    const promtool = requireTool('promtool', 'prometheus');
    // A small prefetch keeps the daemon "under load" so the exposure counters move.
    const space = testSpace('promlint', { TALLY_METRICS_PORT: '0', TALLY_PREFETCH: '50', TALLY_BATCH_WAIT_MS: '20', TALLY_MAX_MESSAGE_BYTES: '4096' });
    try {
      const daemon = await startDaemon(space.env);
      const listening = JSON.parse(await daemon.waitForLog('"msg":"http endpoint listening"')) as { port: number; host: string };
      expect(listening.host, 'TALLY_METRICS_HOST defaults to loopback').to.equal('127.0.0.1');
      // Good, duplicate and bad messages, with timestamps: every instrument gets a sample.
      const workload = generateWorkload({ messages: 3_000, skus: 200, seed: 5, duplicateRate: 0.05, badRate: 0.02, idPrefix: space.queue, maxBytes: 4096 });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);
      await sleep(1_500);
      const text = await metricsText(listening.port);
      const lint = await runTool(promtool, ['check', 'metrics'], { input: text });
      expect(lint.stdout + lint.stderr, 'promtool output').to.equal('');
      expect(lint.code, 'promtool exit code').to.equal(0);

      expect(text).to.match(/^target_info\{[^}]*service_name="tally"/m);
      expect(text, 'no abbreviated unit left').to.not.match(/_ms(_total)?[ {]/);
      for (const name of ['tally_loaded_seconds_total', 'tally_window_message_seconds_total', 'tally_occupied_unacked_message_seconds_total']) {
        expect(text).to.match(new RegExp(`^# TYPE ${name} counter$`, 'm'));
      }
      for (const name of [
        'tally_flush_duration_seconds',
        'tally_crash_window_duration_seconds',
        'messaging_process_duration_seconds',
        'tally_message_age_seconds',
      ]) {
        expect(text).to.match(new RegExp(`^# TYPE ${name} histogram$`, 'm'));
        expect(sample(text, `${name}_count`), `${name}_count`).to.be.greaterThan(0);
      }
      expect(text).to.match(/^# TYPE tally_oldest_unacked_age_seconds gauge$/m);
      expect(text).to.match(/^# TYPE tally_deliveries_in_flight gauge$/m);
      // `_total` only on counters: every *_total series is declared a counter.
      const types = new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map(([, name, type]) => [name!, type!]));
      expect(types.size).to.be.greaterThan(15);
      for (const [name, type] of types) expect(name.endsWith('_total'), `${name} is a ${type}`).to.equal(type === 'counter');
      // Seconds, not milliseconds: the time under load cannot exceed the daemon's life.
      const loaded = sample(text, 'tally_loaded_seconds_total')!;
      expect(loaded).to.be.at.least(0).and.below(120);
      expect((await stopDaemon(daemon)).code).to.equal(0);
    } finally {
      await cleanup(space);
    }
  });

  it('exports the age of the oldest unacked delivery: it grows while Redis is away and falls to 0 once everything is acked', async () => {
    const proxy = await startProxy(6379);
    const space = testSpace('oldest', { TALLY_METRICS_PORT: '0', TALLY_REDIS_URL: `redis://127.0.0.1:${proxy.port}`, TALLY_BATCH_WAIT_MS: '10' });
    try {
      const daemon = await startDaemon(space.env);
      const { port } = JSON.parse(await daemon.waitForLog('"msg":"http endpoint listening"')) as { port: number };
      expect(sample(await metricsText(port), 'tally_oldest_unacked_age_seconds'), 'idle').to.equal(0);
      proxy.pause();
      const workload = generateWorkload({ messages: 20, skus: 5, seed: 9, duplicateRate: 0, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await sleep(2_500);
      const stalled = sample(await metricsText(port), 'tally_oldest_unacked_age_seconds')!;
      expect(stalled, 'seconds since the first delivery waits').to.be.within(1.5, 60);
      proxy.resume();
      await waitForReadyEmpty(space.queue);
      const deadline = Date.now() + 30_000;
      let age = stalled;
      while (age !== 0 && Date.now() < deadline) {
        await sleep(200);
        age = sample(await metricsText(port), 'tally_oldest_unacked_age_seconds')!;
      }
      expect(age, 'back to 0 once acked').to.equal(0);
      expect((await stopDaemon(daemon)).code).to.equal(0);
    } finally {
      await proxy.close();
      await cleanup(space);
    }
  });
});
