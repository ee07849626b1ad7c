/**
 * `pnpm bench --shape-cost`: what a message in a mapped shape costs the
 * daemon against the contract's shape. First in process (parse + split per
 * message, shape-cost.ts), then with the real daemon (tally two-step):
 * each round drains the same workload in both shapes, the foreign one with
 * TALLY_MESSAGE_MAPPING set, and the daemon's CPU per message (all its
 * threads, and the main thread alone, from /proc) is compared pair by pair.
 * Writes shape-cost.json beside the other results.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { startPrivateRedis } from '@tally/testkit';
import { FOREIGN_SHAPE_MAPPING, generateWorkload, type MessageShape } from '@tally/workload';
import { benchContext } from './context.js';
import { runDrain } from './drain.js';
import { workloadShape, type BenchOptions } from './options.js';
import { median } from './stats.js';
import { measureParseCost } from './shape-cost.js';

interface ShapeDrain {
  readonly round: number;
  readonly shape: MessageShape;
  readonly messages: number;
  readonly msgPerSec: number;
  readonly cpuUsPerMessage: number;
  readonly mainCpuUsPerMessage: number;
  readonly correct: boolean;
}

export async function runShapeCost(options: BenchOptions, dir: string, log: (line: string) => void): Promise<number> {
  const inProcess = measureParseCost({ ...workloadShape(options), messages: Math.min(options.messages, 20_000) }, 15);
  log(
    `in process, parse + split: contract ${inProcess.contractUs.toFixed(2)} µs/msg (${Math.round(inProcess.contractBytes)} B), ` +
      `foreign through the mapping ${inProcess.foreignUs.toFixed(2)} µs/msg (${Math.round(inProcess.foreignBytes)} B): ratio ${inProcess.ratio.toFixed(2)}`,
  );

  const server = options.redisUrl === null ? await startPrivateRedis() : null;
  const redisUrl = options.redisUrl ?? server!.url;
  const redis = new Redis(redisUrl, { connectionName: 'tally-bench-shape-cost' });
  const drains: ShapeDrain[] = [];
  try {
    const ctx = benchContext(options, {
      redisUrl,
      redisPrivate: server !== null,
      redis,
      runId: `shape${Date.now().toString(36)}`,
      traceSinkUrl: 'http://127.0.0.1:4318',
      log,
    });
    const mapping = { TALLY_MESSAGE_MAPPING: JSON.stringify(FOREIGN_SHAPE_MAPPING) };
    for (let round = 0; round < options.rounds; round++) {
      // Alternating order: neither shape always drains first in a round.
      const shapes: MessageShape[] = round % 2 === 0 ? ['contract', 'foreign'] : ['foreign', 'contract'];
      for (const shape of shapes) {
        const workloadOptions = { ...workloadShape(options), types: ['sale', 'return'], badRate: 0, shape, idPrefix: `r${round}` };
        const workload = generateWorkload(workloadOptions);
        const warmup =
          options.warmupMessages > 0
            ? generateWorkload({ ...workloadOptions, messages: options.warmupMessages, seed: options.seed + 7_919, idPrefix: `w${round}` })
            : undefined;
        const { record } = await runDrain(ctx, {
          contender: 'tally-two-step',
          round,
          label: `${shape}-r${round}`,
          workload,
          ...(warmup ? { warmup } : {}),
          tallyEnv: { ...options.tallyEnv, ...(shape === 'foreign' ? mapping : {}) },
        });
        const drain: ShapeDrain = {
          round,
          shape,
          messages: record.messages,
          msgPerSec: record.msgPerSec,
          cpuUsPerMessage: (record.cpuSeconds / record.messages) * 1e6,
          mainCpuUsPerMessage: ((record.mainThreadCpuSeconds ?? Number.NaN) / record.messages) * 1e6,
          correct: record.correct,
        };
        drains.push(drain);
        log(
          `  round ${round + 1} ${shape.padEnd(8)} ${Math.round(drain.msgPerSec)} msg/s  daemon cpu ${drain.cpuUsPerMessage.toFixed(1)} µs/msg, main thread ${drain.mainCpuUsPerMessage.toFixed(1)} µs/msg  ${record.correct ? 'correct' : `PROBLEM: ${record.problem}`}`,
        );
      }
    }
  } finally {
    redis.disconnect();
    await server?.stop();
  }
  const pairs = (field: 'cpuUsPerMessage' | 'mainCpuUsPerMessage' | 'msgPerSec') =>
    Array.from({ length: options.rounds }, (_, round) => {
      const of = (shape: MessageShape) => drains.find((d) => d.round === round && d.shape === shape)![field];
      return of('foreign') / of('contract');
    });
  const summary = {
    inProcess,
    drains,
    cpuRatio: median(pairs('cpuUsPerMessage')),
    mainCpuRatio: median(pairs('mainCpuUsPerMessage')),
    rateRatio: median(pairs('msgPerSec')),
  };
  log(
    `daemon CPU per message, foreign / contract, median of ${options.rounds} pairs: all threads ${summary.cpuRatio.toFixed(3)}, main thread ${summary.mainCpuRatio.toFixed(3)}; drain rate ${summary.rateRatio.toFixed(3)}`,
  );
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'shape-cost.json'), `${JSON.stringify(summary, null, 2)}\n`);
  log(`wrote ${join(dir, 'shape-cost.json')}`);
  return drains.every((d) => d.correct) ? 0 : 1;
}
