#!/usr/bin/env node
// Atomic vs two-step drain throughput with the real daemon (after `pnpm build`).
// Each round preloads the same workload (50,000 messages by default, 2%
// duplicates) into a fresh queue and prefix, starts one daemon and times from
// its "consuming" line until the queue has no ready message and the daemon,
// stopped with SIGTERM, has finished and acked what was in flight. Modes
// alternate so that the machine's noise hits both alike; the figure to quote
// is the ratio of the medians.
//
//   node scripts/measure-modes.mjs [messages] [rounds per mode]
import { setTimeout as sleep } from 'node:timers/promises';
import { generateWorkload, publishAll } from '../bench/dist/src/index.js';
import { AMQP_URL, cleanup, queueState, startDaemon, stopDaemon, testSpace } from '../packages/coordinator/dist/test/integration/harness.js';

const messages = Number(process.argv[2] ?? 50_000);
const rounds = Number(process.argv[3] ?? 3);
const results = { 'two-step': [], atomic: [] };

for (let round = 0; round < rounds; round++) {
  for (const mode of ['two-step', 'atomic']) {
    const space = testSpace(`measure-${mode}`, { TALLY_MODE: mode, TALLY_LOG_LEVEL: 'warn' });
    try {
      const workload = generateWorkload({ messages, skus: 1_000, duplicateRate: 0.02, seed: 4242, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const daemon = await startDaemon({ ...space.env, TALLY_LOG_LEVEL: 'info' });
      const started = performance.now();
      while ((await queueState(space.queue)).messageCount > 0) await sleep(20);
      const exit = await stopDaemon(daemon);
      const seconds = (performance.now() - started) / 1000;
      if (exit.code !== 0) throw new Error(`daemon exited ${exit.code}`);
      const rate = workload.publishes.length / seconds;
      results[mode].push(rate);
      console.log(JSON.stringify({ round, mode, messages: workload.publishes.length, seconds: Number(seconds.toFixed(2)), msgPerS: Math.round(rate) }));
    } finally {
      await cleanup(space);
    }
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const twoStep = median(results['two-step']);
const atomic = median(results.atomic);
console.log(JSON.stringify({ medianMsgPerS: { 'two-step': Math.round(twoStep), atomic: Math.round(atomic) }, atomicOverTwoStep: Number((atomic / twoStep).toFixed(3)) }));
