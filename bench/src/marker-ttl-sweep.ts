/**
 * Marker memory in steady state against the marker TTL: Tally two-step
 * consumes while the bench publishes at a fixed rate for long enough that
 * markers expire as fast as they are written (2.5 TTL), and used_memory is
 * sampled over the last TTL. What the markers and receipts hold is that mean
 * minus what is left once they are deleted at the end (counts, stats,
 * layout); divided by the messages one TTL receives (rate × TTL) it is the
 * memory a message costs in steady state, the figure a drain's snapshot
 * cannot give (there every marker is younger than the TTL).
 *
 * Short TTLs keep the sweep to minutes; what varies with the TTL is how full
 * the time buckets' hashes are and how long a marker outlives the TTL (up to
 * one bucket width, half the TTL by default), both shown by the sweep.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { escapeGlob } from '@tally/shared';
import { parseInfo } from '@tally/shared';
import { ensureQueue, generateWorkload, type WorkloadOptions } from '@tally/workload';
import type { BenchContext } from './context.js';
import { contextRunFields, prefixName, queueName } from './context.js';
import { startContender } from './contenders.js';
import { resetSpace } from './drain.js';
import type { MarkerTtlRecord } from './results.js';

export interface TtlSweepPlan {
  readonly ttls: readonly number[];
  readonly rate: number;
  readonly workload: Partial<WorkloadOptions>;
}

async function usedMemory(ctx: BenchContext): Promise<number> {
  return Number(parseInfo(await ctx.redis.info('memory')).get('used_memory'));
}

async function deleteMatching(ctx: BenchContext, pattern: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await ctx.redis.scan(cursor, 'MATCH', pattern, 'COUNT', 2000);
    cursor = next;
    if (keys.length > 0) await ctx.redis.del(...keys);
  } while (cursor !== '0');
}

export async function runMarkerTtlSweep(ctx: BenchContext, plan: TtlSweepPlan): Promise<MarkerTtlRecord[]> {
  const records: MarkerTtlRecord[] = [];
  if (!ctx.redisPrivate) {
    ctx.log('marker TTL sweep skipped: it needs the private Redis (used_memory of nobody else)');
    return records;
  }
  for (const ttl of plan.ttls) {
    const label = `ttl${ttl}`;
    const queue = queueName(ctx, 'tally-two-step', label);
    const prefix = prefixName(ctx, 'tally-two-step', label);
    await resetSpace(ctx, queue, prefix);
    const seconds = 2.5 * ttl + 2;
    const workload = generateWorkload({
      ...plan.workload,
      messages: Math.round(plan.rate * seconds),
      duplicateRate: 0,
      seed: 300 + ttl,
      idPrefix: `ttl${ttl}`,
    });
    const connection = await amqp.connect(ctx.amqpUrl, { clientProperties: { connection_name: 'tally-bench-ttl-sweep' } });
    let problem: string | undefined;
    const samples: number[] = [];
    try {
      await ensureQueue(connection, queue);
      const daemon = await startContender({
        contender: 'tally-two-step',
        queue,
        prefix,
        ...contextRunFields(ctx),
        expected: workload.publishes.length,
        recordLatency: false,
        tallyEnv: { ...ctx.tallyEnv, TALLY_MARKER_TTL_S: String(ttl) },
      });
      try {
        const channel = await connection.createConfirmChannel();
        const started = performance.now();
        const sampleFrom = (seconds - ttl) * 1000;
        let nextSample = sampleFrom;
        let sent = 0;
        while (sent < workload.publishes.length) {
          const elapsed = performance.now() - started;
          const due = Math.min(workload.publishes.length, Math.floor((elapsed / 1000) * plan.rate));
          while (sent < due) {
            const publish = workload.publishes[sent++]!;
            if (!channel.sendToQueue(queue, publish.body, { persistent: true, contentType: 'application/json' }))
              await new Promise((resolve) => channel.once('drain', resolve));
          }
          if (elapsed >= nextSample) {
            samples.push(await usedMemory(ctx));
            nextSample += 500;
          }
          await sleep(2);
        }
        await channel.waitForConfirms();
      } finally {
        const exit = await daemon.stop();
        if (exit.code !== 0) problem = `daemon exited with ${exit.code ?? exit.signal}`;
      }
    } catch (error) {
      problem = error instanceof Error ? error.message : String(error);
    } finally {
      await connection.close().catch(() => {});
    }
    // What is left without markers and receipts: counts, stats, layout.
    await deleteMatching(ctx, `${escapeGlob(prefix)}mk:*`);
    await deleteMatching(ctx, `${escapeGlob(prefix)}w:*`);
    const rest = await usedMemory(ctx);
    await resetSpace(ctx, queue, prefix);
    const mean = samples.reduce((a, b) => a + b, 0) / Math.max(1, samples.length);
    const bytesPerMessage = (mean - rest) / (plan.rate * ttl);
    const record: MarkerTtlRecord = {
      ttlS: ttl,
      rate: plan.rate,
      samples: samples.length,
      markerBytes: mean - rest,
      bytesPerMessage,
      ...(problem ? { problem } : {}),
    };
    ctx.log(
      `  marker TTL ${ttl} s at ${plan.rate} msg/s: ${Math.round(bytesPerMessage)} B per message received in one TTL (${samples.length} samples)${problem ? ` PROBLEM: ${problem}` : ''}`,
    );
    records.push(record);
  }
  return records;
}
