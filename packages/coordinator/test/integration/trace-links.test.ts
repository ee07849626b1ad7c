import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { cleanup, countsOf, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL, CLI } from './harness.js';
import { attribute, SPAN_KIND, startOtlpReceiver, type ReceivedSpan } from './otlp-receiver.js';
import { runTool } from './ops-tools.js';

/** One change of one SKU per message, so every message lands in the same shard batch; each with its own producer context. */
async function publishOneShard(queue: string, sampled: number, unsampled: number): Promise<{ sampledTraces: Set<string>; unsampledTraces: Set<string> }> {
  const sampledTraces = new Set<string>();
  const unsampledTraces = new Set<string>();
  const connection = await amqp.connect(AMQP_URL);
  const channel = await connection.createConfirmChannel();
  await channel.assertQueue(queue, { durable: true });
  for (let i = 0; i < sampled + unsampled; i++) {
    const traceId = randomBytes(16).toString('hex');
    const isSampled = i < sampled;
    (isSampled ? sampledTraces : unsampledTraces).add(traceId);
    channel.sendToQueue(queue, Buffer.from(JSON.stringify({ id: `${queue}-${i}`, changes: [{ sku: 'ONE-SKU', delta: 1 }] })), {
      persistent: true,
      headers: { traceparent: `00-${traceId}-${randomBytes(8).toString('hex')}-${isSampled ? '01' : '00'}` },
    });
  }
  await channel.waitForConfirms();
  await connection.close();
  return { sampledTraces, unsampledTraces };
}

function tracingEnv(port: number): Record<string, string> {
  return { OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_BSP_SCHEDULE_DELAY: '100' };
}

describe('trace links (integration: OTLP receiver)', function () {
  this.timeout(180_000);

  for (const limit of [undefined, '1000'] as const) {
    it(`a batch links every sampled producer up to OTEL_SPAN_LINK_COUNT_LIMIT (${limit ?? 'unset: 128'}); the rest are counted as dropped; unsampled ones are not linked`, async () => {
      const receiver = await startOtlpReceiver();
      const space = testSpace('links', {
        ...tracingEnv(receiver.port),
        TALLY_BATCH_WAIT_MS: '2000',
        TALLY_BATCH_SIZE: '500',
        // Part-scoped markers keep every message of one SKU on one shard, so one batch holds all 500;
        // message-scoped ones would spread them by id over four marker shards, none past 128 links.
        TALLY_MARKER_SCOPE: 'part',
        ...(limit ? { OTEL_SPAN_LINK_COUNT_LIMIT: limit } : {}),
      });
      try {
        const { sampledTraces, unsampledTraces } = await publishOneShard(space.queue, 450, 50);
        const daemon = await startDaemon(space.env);
        await waitForReadyEmpty(space.queue);
        await sleep(2_500);
        expect((await stopDaemon(daemon)).code).to.equal(0);
        await sleep(300);
        expect((await countsOf(space.prefix)).get('ONE-SKU')).to.equal(500);
        // The start says so when a batch may hold more messages than its span keeps links, and only then.
        const warnings = daemon.logs.filter((line) => line.includes('OTEL_SPAN_LINK_COUNT_LIMIT='));
        if (limit === undefined) {
          expect(warnings, 'one start warning').to.have.length(1);
          expect(JSON.parse(warnings[0]!)).to.include({ level: 40, limit: 128, batchSize: 500 }); // pino's warn
        } else expect(warnings, 'no warning: every producer can be linked').to.deep.equal([]);
        const batches = receiver.spans.filter((s) => s.name === 'tally.batch');
        expect(batches.length).to.be.greaterThan(0);
        const cap = limit ? Number(limit) : 128;
        let totalLinked = 0;
        let largest = 0;
        for (const batch of batches) {
          const links = batch.links ?? [];
          expect(links.length).to.be.at.most(cap);
          expect(links.length + (batch.droppedLinksCount ?? 0), 'linked + dropped = sampled producers of the batch').to.equal(
            attribute(batch, 'tally.producers.sampled'),
          );
          for (const link of links) {
            expect(unsampledTraces.has(link.traceId), 'no link to an unsampled producer').to.equal(false);
            expect(sampledTraces.has(link.traceId)).to.equal(true);
          }
          totalLinked += links.length;
          largest = Math.max(largest, links.length);
        }
        const sampledSeen = batches.reduce((sum, b) => sum + Number(attribute(b, 'tally.producers.sampled')), 0);
        expect(sampledSeen, 'every sampled producer reached a batch').to.equal(450);
        if (limit === undefined) {
          expect(largest, 'a big batch is capped at the default 128').to.equal(128);
        } else {
          expect(largest, 'a raised limit lets a batch link more than 128').to.be.greaterThan(128);
          expect(totalLinked, 'with room for all, every sampled producer is linked').to.equal(450);
        }
      } finally {
        await receiver.close();
        await cleanup(space);
      }
    });
  }

  it('tally publish makes producer spans and sends their traceparent: each counting batch links back to them', async () => {
    const receiver = await startOtlpReceiver();
    const space = testSpace('pubtrace', { ...tracingEnv(receiver.port), TALLY_BATCH_WAIT_MS: '20' });
    try {
      const publish = await runTool(
        process.execPath,
        [CLI, 'publish', '--messages', '300', '--skus', '50', '--duplicate-rate', '0', '--seed', '4', '--id-prefix', space.queue],
        {
          env: { ...process.env, ...space.env },
        },
      );
      expect(publish.code, publish.stderr).to.equal(0);
      expect(publish.stderr, 'no progress output when stderr is not a terminal').to.equal('');
      expect((JSON.parse(publish.stdout) as { published: number }).published).to.equal(300);
      const producers = receiver.spans.filter((s) => s.kind === SPAN_KIND.PRODUCER);
      expect(producers.length, 'one producer span per message').to.equal(300);
      for (const span of producers) {
        expect(span.name).to.equal(`send ${space.queue}`);
        expect(span.service).to.equal('tally-publish');
        expect(attribute(span, 'messaging.system')).to.equal('rabbitmq');
        expect(attribute(span, 'messaging.operation.type')).to.equal('send');
        expect(String(attribute(span, 'messaging.message.id'))).to.match(new RegExp(`^${space.queue}`));
      }
      const daemon = await startDaemon(space.env);
      await waitForReadyEmpty(space.queue);
      await sleep(500);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      await sleep(300);
      const producerIds = new Set(producers.map((s: ReceivedSpan) => `${s.traceId}/${s.spanId}`));
      const linked = receiver.spans.filter((s) => s.name === 'tally.batch').flatMap((b) => (b.links ?? []).map((l) => `${l.traceId}/${l.spanId}`));
      // A message split over several shards is linked from each of its batches.
      expect(
        linked.every((id) => producerIds.has(id)),
        'every link leads to a producer span',
      ).to.equal(true);
      expect(new Set(linked).size, 'every producer span is reached by a batch').to.equal(300);
    } finally {
      await receiver.close();
      await cleanup(space);
    }
  });
});
