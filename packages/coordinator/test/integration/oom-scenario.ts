/**
 * Redis runs out of memory mid-stream (noeviction): the scenario behind the
 * refusals integration test and the fault suite's "Redis out of memory" row.
 *
 * A private redis-server with a small maxmemory; the daemon counts part of a
 * workload; the test then fills Redis with one big key until writes fail with
 * OOM, publishes more, and checks what a refusing Redis must look like: /readyz
 * 503 naming OOM, the gauge and counter, nothing acked meanwhile (the broker's
 * ready + unacked stays put) and no count above the truth. Then it deletes the
 * filler and everything must be counted exactly.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { cleanup, compare, startDaemon, stopDaemon, testSpace, AMQP_URL, type DaemonProcess } from './harness.js';
import { parseInfo } from '@tally/shared';
import { asAdmin, startPrivateRedis } from '@tally/testkit';
import { brokerQueue, countsAt, metricsText, readyz, sample, waitFor } from './runtime-probes.js';

export interface OomOutcome {
  readonly messages: number;
  /** Units below / above the truth at the end. */
  readonly lostUnits: number;
  readonly overcountUnits: number;
  readonly refusedAttempts: number;
  readonly reason: string;
  readonly refusedForMs: number;
}

function units(counts: Map<string, number>, truth: Map<string, number>): { lost: number; over: number; aboveSkus: string[] } {
  let lost = 0;
  let over = 0;
  const aboveSkus: string[] = [];
  for (const sku of new Set([...counts.keys(), ...truth.keys()])) {
    const diff = (counts.get(sku) ?? 0) - (truth.get(sku) ?? 0);
    if (diff < 0) lost -= diff;
    if (diff > 0) {
      over += diff;
      aboveSkus.push(sku);
    }
  }
  return { lost, over, aboveSkus };
}

export async function runOomScenario(options: { before: number; during: number; seed: number; label: string }): Promise<OomOutcome> {
  const server = await startPrivateRedis({ args: ['--maxmemory', '24mb', '--maxmemory-policy', 'noeviction'] });
  const url = `redis://127.0.0.1:${server.port}`;
  const space = testSpace(options.label, { TALLY_REDIS_URL: url, TALLY_METRICS_PORT: '0', TALLY_BATCH_WAIT_MS: '20', TALLY_HEARTBEAT_MS: '500' });
  let daemon: DaemonProcess | null = null;
  try {
    const first = generateWorkload({ messages: options.before, skus: 500, seed: options.seed, duplicateRate: 0.02, idPrefix: `${space.queue}-a` });
    const second = generateWorkload({ messages: options.during, skus: 500, seed: options.seed + 1, duplicateRate: 0.02, idPrefix: `${space.queue}-b` });
    const truth = new Map(first.truth);
    for (const [sku, count] of second.truth) truth.set(sku, (truth.get(sku) ?? 0) + count);

    await publishAll(first.publishes, { url: AMQP_URL, queue: space.queue });
    daemon = await startDaemon(space.env);
    const port = Number(JSON.parse(await daemon.waitForLog('http endpoint listening')).port);
    await waitFor(
      'the first part counted',
      async () => (await brokerQueue(space.queue)).ready === 0 && (await brokerQueue(space.queue)).unacked === 0,
      120_000,
    );
    expect((await readyz(port)).code, 'ready before the filler').to.equal(200);

    // Fill Redis past maxmemory with one big key: from now on every write is refused with OOM.
    // (In chunks: one huge SET would be refused itself, its own query buffer counting as used memory.)
    await asAdmin(server, async (admin) => {
      // Big chunks first, then small ones to the brim: a 512 KB chunk is refused
      // with up to 512 KB of room left, which Tally's compact markers would
      // take a long while to fill.
      let field = 0;
      for (const size of [512 * 1024, 1024]) {
        const chunk = 'x'.repeat(size);
        for (let i = 0; ; i++) {
          const refused = await admin.hset(`${space.prefix}filler`, `f${field++}`, chunk).then(
            () => null,
            (error: Error) => error.message,
          );
          if (refused !== null) {
            expect(refused, 'the filler ends on an OOM refusal').to.match(/^OOM/);
            break;
          }
          expect(i, 'maxmemory reached within 1,000 chunks').to.be.below(1_000);
        }
      }
    });
    // The filling connection's buffers (half a megabyte) are freed when it
    // closes, room for thousands of compact markers: once it is closed, put
    // the limit below what Redis holds, so every write is refused whatever
    // its size. Deleting the filler (megabytes) makes room again.
    await asAdmin(server, async (admin) => {
      const used = Number(parseInfo(await admin.info('memory')).get('used_memory'));
      await admin.config('SET', 'maxmemory', String(used - 256 * 1024));
    });
    const filledAt = Date.now();
    await publishAll(second.publishes, { url: AMQP_URL, queue: space.queue });

    // /readyz turns 503 with the OOM reason; the gauge and the counter say it too.
    const notReady = await waitFor(
      '/readyz 503 with an OOM reason',
      async () => {
        const answer = await readyz(port);
        return answer.code === 503 && /^redis refusing writes: OOM/.test(answer.body.reason ?? '') ? answer : null;
      },
      30_000,
      100,
    ).catch(async (error: Error) => {
      // What the daemon and the servers were doing instead.
      const memory = await asAdmin(server, async (admin) => parseInfo(await admin.info('memory')));
      throw new Error(
        `${error.message}; queue ${JSON.stringify(await brokerQueue(space.queue))}; used_memory ${memory.get('used_memory')} of ${memory.get('maxmemory')}; daemon's last logs:\n${daemon!.logs.slice(-15).join('\n')}`,
      );
    });
    expect(notReady.body.since, 'since is an ISO time').to.match(/^\d{4}-\d\d-\d\dT/);
    const metrics = await metricsText(port);
    expect(sample(metrics, 'tally_redis_refusing', { error_type: 'OOM' }), 'tally_redis_refusing{error_type="OOM"}').to.equal(1);
    const refusedAttempts = sample(metrics, 'tally_redis_refused_attempts_total', { error_type: 'OOM' }) ?? 0;
    expect(refusedAttempts, 'refused attempts counted').to.be.greaterThan(0);
    await daemon.waitForLog('redis refusing writes: OOM', 5_000);

    // Nothing is acked while Redis refuses: the broker's ready + unacked does not move, and no count is above the truth.
    const held = await brokerQueue(space.queue);
    await sleep(2_000);
    const later = await brokerQueue(space.queue);
    expect(later.ready + later.unacked, `nothing acked while refused (${JSON.stringify(held)} -> ${JSON.stringify(later)})`).to.equal(
      held.ready + held.unacked,
    );
    expect(later.unacked, 'deliveries wait unacked').to.be.greaterThan(0);
    const during = units(await countsAt(url, space.prefix), truth);
    expect(during.aboveSkus, 'no count above the truth while refused').to.deep.equal([]);
    const stillRefused = await readyz(port);
    expect(stillRefused.code, 'still not ready').to.equal(503);
    expect(stillRefused.body.messagesInProgress, '/readyz messagesInProgress: messages whose parts wait to be written').to.be.a('number').greaterThan(0);

    // Room again: everything is counted, /readyz is 200 again, the log says it cleared.
    await asAdmin(server, (admin) => admin.del(`${space.prefix}filler`));
    const refusedForMs = Date.now() - filledAt;
    await waitFor('/readyz 200 after the filler is gone', async () => (await readyz(port)).code === 200, 60_000, 100);
    await daemon.waitForLog('redis accepts writes again', 10_000);
    await waitFor(
      'the queue drained',
      async () => {
        const state = await brokerQueue(space.queue);
        return state.ready === 0 && state.unacked === 0;
      },
      120_000,
    );
    expect(sample(await metricsText(port), 'tally_redis_refusing', { error_type: 'OOM' }), 'the gauge is back to 0').to.equal(0);
    const exit = await stopDaemon(daemon);
    expect(exit.code, 'clean stop').to.equal(0);
    const end = compare(await countsAt(url, space.prefix), truth);
    const totals = units(await countsAt(url, space.prefix), truth);
    expect(end.below, 'no SKU below the truth').to.deep.equal([]);
    return {
      messages: first.publishes.length + second.publishes.length,
      lostUnits: totals.lost,
      overcountUnits: totals.over,
      refusedAttempts,
      reason: notReady.body.reason ?? '',
      refusedForMs,
    };
  } finally {
    if (daemon && daemon.child.exitCode === null && daemon.child.signalCode === null) daemon.child.kill('SIGKILL');
    await cleanup(space).catch(() => {});
    await server.stop();
  }
}
