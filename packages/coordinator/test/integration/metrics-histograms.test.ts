import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { MESSAGE_AGE, PROCESS_DURATION } from '../../src/telemetry/metrics.js';
import { cleanup, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';

/** Every sample of one series family, keyed by its full label set. */
function samples(text: string, name: string): Map<string, number> {
  return new Map(
    [...text.matchAll(new RegExp(`^(${name}(?:_bucket|_count|_sum)\\{[^}]*\\}) (\\S+)$`, 'gm'))].map(([, series, value]) => [series!, Number(value)]),
  );
}

/** `le` label value as the exporter writes it. */
const le = (bound: number): string => (bound === Infinity ? '+Inf' : String(bound));

describe('per-delivery histograms on a live /metrics (integration: exact series against the deliveries made)', function () {
  this.timeout(180_000);

  it('counts every acked delivery once in messaging_process_duration_seconds and every timestamped one in its age bucket', async () => {
    const space = testSpace('histo', { TALLY_METRICS_PORT: '0', TALLY_BATCH_WAIT_MS: '10' });
    try {
      const daemon = await startDaemon(space.env);
      const { port } = JSON.parse(await daemon.waitForLog('"msg":"http endpoint listening"')) as { port: number };
      // Ages chosen far from every bound, so the bucket of each is known whatever the delay: (60, 300], (30, 60], 0 (a future timestamp), none.
      const now = Date.now();
      const groups = [
        { count: 40, timestamp: now - 100_000 },
        { count: 30, timestamp: now - 40_000 },
        { count: 10, timestamp: now + 3_600_000 },
        { count: 20, timestamp: undefined },
      ];
      const connection = await amqp.connect(AMQP_URL);
      const channel = await connection.createConfirmChannel();
      let n = 0;
      for (const { count, timestamp } of groups) {
        for (let i = 0; i < count; i++, n++) {
          const body = Buffer.from(JSON.stringify({ id: `${space.queue}-${n}`, changes: [{ sku: `sku-${n % 7}`, delta: 1 }] }));
          channel.sendToQueue(space.queue, body, { persistent: true, ...(timestamp === undefined ? {} : { timestamp }) });
        }
      }
      await channel.waitForConfirms();
      await connection.close();
      const published = Date.now();
      await waitForReadyEmpty(space.queue);

      const processCount = `messaging_process_duration_seconds_count{messaging_system="rabbitmq",messaging_destination_name="${space.queue}",messaging_operation_type="process",otel_scope_name="tally"}`;
      let text = '';
      const deadline = Date.now() + 20_000;
      while (samples(text, 'messaging_process_duration_seconds').get(processCount) !== 100 && Date.now() < deadline) {
        await sleep(100);
        text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      }
      const drainedWithin = (Date.now() - published) / 1000;

      // messaging.process.duration: one record per acked delivery, timestamped or not; the bucket counts are cumulative up to +Inf = _count.
      const processLabels = `messaging_system="rabbitmq",messaging_destination_name="${space.queue}",messaging_operation_type="process",otel_scope_name="tally"`;
      const process = samples(text, 'messaging_process_duration_seconds');
      expect(process.get(processCount), '_count: one per delivery').to.equal(100);
      const processBuckets = [...PROCESS_DURATION.boundaries, Infinity].map((bound) =>
        process.get(`messaging_process_duration_seconds_bucket{${processLabels},le="${le(bound)}"}`),
      );
      expect(
        processBuckets.every((v) => typeof v === 'number'),
        `every bucket, with exactly these labels: ${[...process.keys()].join(' ')}`,
      ).to.equal(true);
      expect(process.size, 'no other series: buckets, _count, _sum').to.equal(processBuckets.length + 2);
      for (let i = 1; i < processBuckets.length; i++) expect(processBuckets[i]!, `cumulative at ${i}`).to.be.at.least(processBuckets[i - 1]!);
      expect(processBuckets.at(-1), '+Inf = _count').to.equal(100);
      const processSum = process.get(`messaging_process_duration_seconds_sum{${processLabels}}`)!;
      expect(processSum)
        .to.be.greaterThan(0)
        .and.at.most(100 * (drainedWithin + 30));

      // tally.message.age: one record per timestamped delivery, each in its known bucket.
      const ageLabels = `messaging_system="rabbitmq",messaging_destination_name="${space.queue}",otel_scope_name="tally"`;
      const age = samples(text, 'tally_message_age_seconds');
      const expected = [...MESSAGE_AGE.boundaries, Infinity].map((bound) => (bound < 60 ? 10 : bound < 300 ? 40 : 80));
      const actual = [...MESSAGE_AGE.boundaries, Infinity].map((bound) => age.get(`tally_message_age_seconds_bucket{${ageLabels},le="${le(bound)}"}`));
      expect(actual, 'cumulative age buckets').to.deep.equal(expected);
      expect(age.get(`tally_message_age_seconds_count{${ageLabels}}`), '_count: the timestamped deliveries').to.equal(80);
      expect(age.size).to.equal(expected.length + 2);
      // 40 ages in [100, 100 + d], 30 in [40, 40 + d], 10 at 0: d is at most the time from publishing to this scrape (+ clock granularity).
      const ageSum = age.get(`tally_message_age_seconds_sum{${ageLabels}}`)!;
      const d = (Date.now() - now) / 1000 + 1;
      expect(ageSum)
        .to.be.at.least(40 * 100 + 30 * 40 - 1)
        .and.at.most(40 * 100 + 30 * 40 + 70 * d);

      expect(text).to.match(/^# TYPE messaging_process_duration_seconds histogram$/m);
      expect(text).to.match(/^# UNIT tally_message_age_seconds s$/m);
      expect((await stopDaemon(daemon)).code).to.equal(0);
    } finally {
      await cleanup(space);
    }
  });
});
