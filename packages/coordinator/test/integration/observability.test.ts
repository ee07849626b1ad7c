import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { generateWorkload } from '@tally/workload';
import { startProxy } from '@tally/testkit';
import { cleanup, statsOf, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes?: Array<{ key: string; value: Record<string, unknown> }>;
  links?: Array<{ traceId: string; spanId: string }>;
  droppedLinksCount?: number;
  events?: Array<{ name: string }>;
  status?: { code?: number };
  scope: string;
}

/** A small OTLP/HTTP receiver on loopback: keeps JSON spans, and raw protobuf bodies. */
async function startReceiver(): Promise<{ port: number; spans: OtlpSpan[]; protobufBodies: Buffer[]; close(): Promise<void> }> {
  const spans: OtlpSpan[] = [];
  const protobufBodies: Buffer[] = [];
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const body = Buffer.concat(chunks);
      if (request.url === '/v1/traces') {
        if (String(request.headers['content-type']).includes('json')) {
          const payload = JSON.parse(body.toString('utf8')) as {
            resourceSpans: Array<{ scopeSpans: Array<{ scope: { name: string }; spans: OtlpSpan[] }> }>;
          };
          for (const rs of payload.resourceSpans) for (const ss of rs.scopeSpans) for (const span of ss.spans) spans.push({ ...span, scope: ss.scope.name });
        } else {
          protobufBodies.push(body);
        }
      }
      response.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  return {
    port: (server.address() as AddressInfo).port,
    spans,
    protobufBodies,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

function attr(span: OtlpSpan, key: string): unknown {
  const value = span.attributes?.find((a) => a.key === key)?.value;
  if (value === undefined) return undefined;
  if ('intValue' in value) return Number(value.intValue);
  return Object.values(value)[0];
}

async function publishWithTraceparents(queue: string, count: number): Promise<Set<string>> {
  const workload = generateWorkload({ messages: count, skus: 200, seed: 77, duplicateRate: 0, idPrefix: queue, idInPropertyShare: 0 });
  const traceIds = new Set<string>();
  const connection = await amqp.connect(AMQP_URL);
  const channel = await connection.createConfirmChannel();
  await channel.assertQueue(queue, { durable: true });
  for (const publish of workload.publishes) {
    const traceId = randomBytes(16).toString('hex');
    traceIds.add(traceId);
    channel.sendToQueue(queue, publish.body, {
      persistent: true,
      timestamp: Date.now(),
      headers: { traceparent: `00-${traceId}-${randomBytes(8).toString('hex')}-01` },
    });
  }
  await channel.waitForConfirms();
  await connection.close();
  return traceIds;
}

async function get(port: number, path: string): Promise<{ status: number; body: string }> {
  const response = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: response.status, body: await response.text() };
}

async function waitForStatus(port: number, path: string, status: number, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if ((await get(port, path)).status === status) return;
    await sleep(100);
  }
  throw new Error(`${path} did not answer ${status} within ${timeoutMs} ms`);
}

/** Prometheus text -> metric name (without labels) -> summed value. */
function scrape(text: string): Map<string, number> {
  const values = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line.trim() === '') continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    values.set(match[1]!, (values.get(match[1]!) ?? 0) + Number(match[3]));
  }
  return values;
}

describe('observability (integration: OTLP receiver, /metrics, /readyz, logs)', function () {
  this.timeout(180_000);

  it('exports the span tree over OTLP http/json, serves metrics matching tally stats, turns unready without Redis, logs trace ids and no password', async () => {
    const receiver = await startReceiver();
    const proxy = await startProxy(6379);
    const password = 'S3cr3t-pw-for-tally';
    const space = testSpace('otel', {
      TALLY_REDIS_URL: `redis://:${password}@127.0.0.1:${proxy.port}`,
      TALLY_METRICS_PORT: '0',
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${receiver.port}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
      OTEL_BSP_SCHEDULE_DELAY: '100',
      OTEL_SERVICE_NAME: 'tally-test',
      TALLY_BATCH_WAIT_MS: '20',
    });
    try {
      const daemon = await startDaemon(space.env);
      const listening = JSON.parse(await daemon.waitForLog('"msg":"http endpoint listening"')) as { port: number };
      const port = listening.port;
      expect((await get(port, '/healthz')).status).to.equal(200);
      await waitForStatus(port, '/readyz', 200);

      const producers = await publishWithTraceparents(space.queue, 2_000);
      await waitForReadyEmpty(space.queue);

      // Counters on /metrics match `tally stats` once the stats are flushed.
      const deadline = Date.now() + 15_000;
      let metricsText = '';
      let stats = await statsOf(space.prefix);
      for (;;) {
        metricsText = (await get(port, '/metrics')).body;
        stats = await statsOf(space.prefix);
        const m = scrape(metricsText);
        if (m.get('tally_received_total') === stats.received && stats.counted === 2_000) break;
        if (Date.now() > deadline) throw new Error(`metrics never matched stats: ${JSON.stringify(stats)}`);
        await sleep(200);
      }
      const m = scrape(metricsText);
      for (const name of ['received', 'counted', 'duplicates', 'dead_lettered', 'occupation_failures', 'redelivered_unmarked']) {
        expect(m.get(`tally_${name}_total`), name).to.equal(stats[name as keyof typeof stats]);
      }
      expect(m.get('messaging_client_consumed_messages_total')).to.equal(2_000);
      expect(m.get('tally_batch_size_count'), 'batch size histogram').to.be.greaterThan(0);
      expect(m.get('tally_crash_window_duration_seconds_count'), 'crash window histogram').to.be.greaterThan(0);
      expect(m.get('tally_message_age_seconds_count'), 'end-to-end age histogram').to.equal(2_000);
      expect(m.get('tally_flush_duration_seconds_count')).to.be.greaterThan(0);
      expect(metricsText).to.match(/tally_connection_up\{[^}]*server_type="redis"[^}]*\} 1/);
      expect(metricsText).to.include('tally_shard_queue_depth');

      // Redis goes away: unready; back: ready. A batch in flight meanwhile logs its retries with its trace id.
      proxy.pause();
      await waitForStatus(port, '/readyz', 503);
      expect((await get(port, '/healthz')).status, 'alive while unready').to.equal(200);
      await publishWithTraceparents(space.queue, 50);
      await sleep(1_500);
      proxy.resume();
      await waitForStatus(port, '/readyz', 200);
      await waitForReadyEmpty(space.queue);
      await sleep(500);
      const exit = await stopDaemon(daemon);
      expect(exit.code).to.equal(0);

      // Spans (the exporter flushed on stop).
      await sleep(300);
      const batches = receiver.spans.filter((s) => s.name === 'tally.batch');
      expect(batches.length, 'batch spans').to.be.greaterThan(0);
      for (const batch of batches) {
        expect(attr(batch, 'messaging.system')).to.equal('rabbitmq');
        expect(attr(batch, 'messaging.destination.name')).to.equal(space.queue);
        expect(attr(batch, 'messaging.operation.type')).to.equal('process');
        expect(attr(batch, 'messaging.batch.message_count')).to.be.greaterThan(0);
        expect(attr(batch, 'tally.shard')).to.be.within(0, 15);
        expect(attr(batch, 'tally.mode')).to.equal('two-step');
        expect(attr(batch, 'tally.skus.distinct')).to.be.greaterThan(0);
        expect(Number(attr(batch, 'tally.messages.new')) + Number(attr(batch, 'tally.messages.duplicate'))).to.equal(
          attr(batch, 'messaging.batch.message_count'),
        );
        expect(batch.scope).to.equal('tally.coordinator');
      }
      const linked = batches.flatMap((b) => (b.links ?? []).map((l) => l.traceId));
      expect(linked.length, 'links to producers').to.be.greaterThan(0);
      expect(linked.filter((id) => producers.has(id)).length, "links point at the publishers' traces").to.be.greaterThan(100);
      for (const batch of batches) {
        const links = batch.links?.length ?? 0;
        expect(links, 'links capped by OTEL_SPAN_LINK_COUNT_LIMIT (128)').to.be.at.most(128);
        // Every message carried its own sampled producer trace: each is linked, or dropped by the SDK's limit and counted.
        expect(attr(batch, 'tally.producers.sampled')).to.equal(attr(batch, 'messaging.batch.message_count'));
        expect(links + (batch.droppedLinksCount ?? 0)).to.equal(attr(batch, 'tally.producers.sampled'));
      }
      const withChildren = batches.find((b) => receiver.spans.some((s) => s.parentSpanId === b.spanId));
      expect(withChildren, 'a batch with worker-thread children').to.not.equal(undefined);
      const children = receiver.spans.filter((s) => s.parentSpanId === withChildren!.spanId);
      expect(children.map((c) => c.name).sort()).to.deep.equal(['tally.crash_window', 'tally.occupy_markers', 'tally.precheck', 'tally.write_counts']);
      for (const child of children) {
        expect(child.traceId, "worker-thread spans share the coordinator's trace").to.equal(withChildren!.traceId);
        expect(child.scope, 'made in the worker thread').to.equal('tally.worker');
      }
      const byName = new Map(children.map((c) => [c.name, c]));
      const window = byName.get('tally.crash_window')!;
      // Sibling spans each anchor their own clock to the wall clock, so they
      // may disagree by a fraction of a millisecond: compare with 2 ms slack.
      const slack = 2_000_000n;
      expect(
        BigInt(window.startTimeUnixNano) <= BigInt(byName.get('tally.write_counts')!.startTimeUnixNano) + slack,
        'the window opens with the write',
      ).to.equal(true);
      expect(BigInt(window.endTimeUnixNano) + slack >= BigInt(byName.get('tally.occupy_markers')!.endTimeUnixNano), 'and closes after the occupation').to.equal(
        true,
      );
      const erred = receiver.spans.filter((s) => s.events?.some((e) => e.name === 'tally.redis_error'));
      expect(erred.length, 'a Redis error recorded an event').to.be.greaterThan(0);
      expect(
        erred.every((s) => s.status?.code === 2),
        'and set the span status to error',
      ).to.equal(true);

      // Logs: the retries carry the trace id; nothing carries the password.
      const retries = daemon.logs.filter((l) => l.includes('redis step failed'));
      expect(retries.length, 'retries logged during the outage').to.be.greaterThan(0);
      const traced = retries.map((l) => JSON.parse(l) as { trace_id?: string }).filter((r) => r.trace_id);
      expect(traced.length, 'with a trace id').to.be.greaterThan(0);
      const traceIds = new Set(receiver.spans.map((s) => s.traceId));
      expect(
        traced.some((r) => traceIds.has(r.trace_id!)),
        'the trace id of an exported trace',
      ).to.equal(true);
      expect(daemon.logs.join('\n') + daemon.stderr.join('')).to.not.include(password);
    } finally {
      await proxy.close();
      await receiver.close();
      await cleanup(space);
    }
  });

  it('exports over OTLP http/protobuf too', async () => {
    const receiver = await startReceiver();
    const space = testSpace('otel-pb', {
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${receiver.port}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
      OTEL_BSP_SCHEDULE_DELAY: '100',
    });
    try {
      const daemon = await startDaemon(space.env);
      await publishWithTraceparents(space.queue, 200);
      await waitForReadyEmpty(space.queue);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      await sleep(300);
      const body = Buffer.concat(receiver.protobufBodies);
      expect(receiver.protobufBodies.length, 'protobuf exports received').to.be.greaterThan(0);
      // Protobuf keeps strings as UTF-8 bytes: the span names are in the payload.
      for (const name of ['tally.batch', 'tally.precheck', 'tally.write_counts', 'tally.crash_window', 'tally.occupy_markers']) {
        expect(body.includes(Buffer.from(name)), name).to.equal(true);
      }
    } finally {
      await receiver.close();
      await cleanup(space);
    }
  });

  it('serves no endpoint and exports nothing when neither TALLY_METRICS_PORT nor OTEL_* is set', async () => {
    const receiver = await startReceiver();
    const space = testSpace('otel-off');
    try {
      const daemon = await startDaemon(space.env);
      expect(daemon.logs.some((l) => l.includes('http endpoint listening'))).to.equal(false);
      expect(daemon.logs.some((l) => l.includes('tracing on'))).to.equal(false);
      await publishWithTraceparents(space.queue, 100);
      await waitForReadyEmpty(space.queue);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      expect(receiver.spans.length + receiver.protobufBodies.length).to.equal(0);
    } finally {
      await receiver.close();
      await cleanup(space);
    }
  });
});
