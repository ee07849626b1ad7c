#!/usr/bin/env node
/**
 * The ceiling: a bare amqplib consumer that does the least a real consumer
 * must (JSON.parse each body, ack) with the daemon's prefetch and a
 * multiple-ack every `ackEvery` deliveries. It writes nothing anywhere, so
 * its drain rate is what RabbitMQ and one Node process can do on this
 * machine. Runs as its own process so its CPU and RSS are its own. With
 * `stream` it reads a stream from its first offset: the ceiling of a stream.
 */
import amqp, { type ConsumeMessage } from 'amqplib';
import { onTerminate, readSettings, report, warmupReporter } from './protocol.js';

const settings = readSettings(process.env);
const warmed = warmupReporter(settings.warmup);
const connection = await amqp.connect(settings.amqpUrl, { clientProperties: { connection_name: 'tally-bench-ceiling' } });
const channel = await connection.createChannel();
await channel.prefetch(settings.prefetch);

let last: ConsumeMessage | null = null;
let unacked = 0;
let acked = 0;
let timer: NodeJS.Timeout | null = null;
const stamps: number[] = [];
const samples: Array<[number, number]> = [];

function flush(): void {
  if (timer !== null) {
    clearTimeout(timer);
    timer = null;
  }
  if (last === null) return;
  channel.ack(last, true);
  const now = Date.now();
  if (settings.recordLatency) {
    for (const stamp of stamps) samples.push([stamp, now - stamp]);
    stamps.length = 0;
  }
  acked += unacked;
  unacked = 0;
  last = null;
  warmed(acked);
  if (acked === settings.expected) {
    report({ event: 'done', at: now, acked, duplicates: 0, ...(settings.recordLatency ? { samples } : {}) });
  }
}

await channel.consume(
  settings.queue,
  (message) => {
    if (message === null) return;
    // The parse is the point: a consumer that does not look at the body is not a ceiling for one that must.
    JSON.parse(message.content.toString('utf8'));
    if (settings.recordLatency) stamps.push(Number(message.properties.timestamp));
    last = message;
    unacked++;
    if (unacked >= settings.ackEvery || acked + unacked === settings.expected) flush();
    else if (timer === null) timer = setTimeout(flush, settings.ackWaitMs);
  },
  settings.stream === true ? { arguments: { 'x-stream-offset': 'first' } } : {},
);
report({ event: 'consuming', at: Date.now() });

onTerminate(async () => {
  flush();
  await connection.close().catch(() => {});
});
