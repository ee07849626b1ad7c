/**
 * End-to-end latency at a controlled load: the contender consumes an empty
 * queue while the bench publishes at a fixed rate (a fraction of the
 * ceiling's drain rate), each message stamped with Date.now() in the AMQP
 * `timestamp` property.
 *
 * How latency is taken, per contender:
 *   - ceiling, naive: the consumer itself computes ack time - timestamp for
 *     every delivery (exact, same clock).
 *   - Tally: the daemon reports nothing per message, so the bench samples
 *     about a thousand messages per run and polls Redis every 5 ms for their
 *     idempotency markers (one per shard the message touches, or one per
 *     message in message scope, as the prefix's layout records). A message's
 *     latency is the first poll that sees all its markers minus its publish
 *     time. The markers are the daemon's last Redis write before the ack
 *     (the ack follows one thread hop later), so this is publish-to-marked,
 *     with up to 5 ms of polling granularity on top.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { bucketOf, layoutKey, markerBucketKey, markerDigest, markerMetaKey, markerScopeOf, markerShardOf, shardOf, subBucketOf } from '@tally/shared';
import type { BenchContext } from './context.js';
import { contextRunFields, prefixName, queueName } from './context.js';
import { isTally, startContender } from './contenders.js';
import { resetSpace } from './drain.js';
import type { ContenderName, LatencyRecord } from './results.js';
import { summarizeLatencies } from './stats.js';
import { watchCounts } from './tally-progress.js';
import { queueState } from './broker.js';
import { readCounts } from '@tally/coordinator/counts';
import { compareWithTruth, describeTruthCheck, ensureQueue, type Workload } from '@tally/workload';

export interface LatencyPlan {
  readonly contender: ContenderName;
  readonly round: number | null;
  readonly label: string;
  readonly loadFraction: number;
  readonly rate: number;
  /**
   * Messages published during the first warmupMs are consumed and verified
   * but not sampled: the daemon's threads connect and JIT-compile then, and
   * that start-up belongs to no steady-state latency.
   */
  readonly warmupMs: number;
  /** Generated with messages = rate × (warm-up + seconds) and no duplicates, so every message is a first delivery. */
  readonly workload: Workload;
  readonly tallyEnv?: Readonly<Record<string, string>>;
  readonly probeTarget?: number;
  readonly pollMs?: number;
}

interface Probe {
  /** Part scope: the virtual shards the message touches, one marker on each. */
  readonly partShards: number[];
  /** Message scope: the one marker shard of its digest. */
  readonly messageShards: number[];
  readonly digest: Buffer;
  readonly publishedAt: number;
}

function probeFor(ctx: BenchContext, body: Buffer, id: string, publishedAt: number): Probe {
  const digest = markerDigest(id);
  const parsed = JSON.parse(body.toString('utf8')) as { changes: Array<{ sku: string }> };
  const shards = new Set(parsed.changes.map((c) => shardOf(c.sku, ctx.virtualShards)));
  return { partShards: [...shards], messageShards: [markerShardOf(digest, ctx.virtualShards)], digest, publishedAt };
}

/**
 * Which probes have every marker done: HGET of each marker field in the
 * bucket of now and the one before (a sampled message is marked within
 * seconds, so no older bucket can hold it), one pipeline per poll.
 */
async function markedProbes(ctx: BenchContext, prefix: string, batch: readonly Probe[]): Promise<boolean[]> {
  const [bucketS, format] = await ctx.redis.hmget(layoutKey(prefix), 'marker_bucket_s', 'marker_format');
  const width = Number(bucketS);
  if (!(width >= 1)) return batch.map(() => false);
  // Where the markers are follows the scope the prefix was laid out with, whatever the bench asked for.
  const messageScope = markerScopeOf(format ?? '') === 'message';
  const probes = batch.map((probe) => ({ digest: probe.digest, shards: messageScope ? probe.messageShards : probe.partShards }));
  const [seconds] = await ctx.redis.time();
  const current = bucketOf(Number(seconds), width);
  // Each shard's bucket has its own sub-bucket count, in its meta hash.
  const shards = [...new Set(probes.flatMap((p) => p.shards))];
  const metas = ctx.redis.pipeline();
  for (const vshard of shards) for (const bucket of [current, current - 1]) metas.hget(markerMetaKey(prefix, vshard, bucket), 's');
  const counts = ((await metas.exec()) ?? []).map(([, s]) => Number(s ?? 0));
  const subsOf = new Map<string, number>();
  shards.forEach((vshard, i) => [current, current - 1].forEach((bucket, j) => subsOf.set(`${vshard}:${bucket}`, counts[2 * i + j]!)));
  const pipeline = ctx.redis.pipeline();
  for (const probe of probes) {
    for (const vshard of probe.shards) {
      for (const bucket of [current, current - 1]) {
        const subs = subsOf.get(`${vshard}:${bucket}`)!;
        // No meta: no marker in that bucket yet; ask for a key that cannot exist, keeping the reply positions.
        pipeline.hget(
          subs >= 1 ? markerBucketKey(prefix, vshard, bucket, subBucketOf(probe.digest, subs)) : markerMetaKey(prefix, vshard, bucket),
          probe.digest as unknown as string,
        );
      }
    }
  }
  const replies = ((await pipeline.exec()) ?? []).map(([, value]) => value as string | null);
  // A two-step marker holds its batch's number: done once the batch's record in the bucket's meta hash is '1'.
  const records = ctx.redis.pipeline();
  const asked: number[] = [];
  let at = 0;
  for (const probe of probes) {
    for (const vshard of probe.shards) {
      for (const bucket of [current, current - 1]) {
        const value = replies[at];
        if (value !== null && value !== undefined && value !== '1') {
          records.hget(markerMetaKey(prefix, vshard, bucket), `b${value}`);
          asked.push(at);
        }
        at++;
      }
    }
  }
  const resolved = asked.length > 0 ? ((await records.exec()) ?? []) : [];
  const done = replies.map((value) => value === '1');
  asked.forEach((position, i) => (done[position] = resolved[i]?.[1] === '1'));
  at = 0;
  return probes.map((probe) => {
    let all = true;
    for (let j = 0; j < probe.shards.length; j++) {
      if (!done[at] && !done[at + 1]) all = false;
      at += 2;
    }
    return all;
  });
}

function failedLatencyRecord(plan: LatencyPlan, problem: string): LatencyRecord {
  const nan = Number.NaN;
  const method = isTally(plan.contender) ? 'marker-probe' : 'ack';
  return {
    contender: plan.contender,
    round: plan.round,
    loadFraction: plan.loadFraction,
    targetRate: plan.rate,
    achievedRate: nan,
    published: plan.workload.publishes.length,
    samples: 0,
    p50Ms: nan,
    p99Ms: nan,
    maxMs: nan,
    method,
    correct: false,
    problem,
  };
}

export async function runLatency(ctx: BenchContext, plan: LatencyPlan): Promise<LatencyRecord> {
  const { contender, workload } = plan;
  const queue = queueName(ctx, contender, plan.label);
  const prefix = prefixName(ctx, contender, plan.label);
  const publishes = workload.publishes;
  await resetSpace(ctx, queue, prefix);
  const connection = await amqp.connect(ctx.amqpUrl, { clientProperties: { connection_name: 'tally-bench-latency' } });
  let problem: string | undefined;
  const latencies: number[] = [];
  let achievedRate: number;
  const tally = isTally(contender);
  try {
    await ensureQueue(connection, queue);
    const started = await startContender({
      contender,
      queue,
      prefix,
      ...contextRunFields(ctx),
      expected: publishes.length,
      recordLatency: !tally,
      tallyEnv: { ...ctx.tallyEnv, ...plan.tallyEnv },
    }).catch((error: unknown) => (error instanceof Error ? error : new Error(String(error))));
    // A contender that cannot start is a failed run, recorded (the bench exits 1), not a skipped one.
    if (started instanceof Error) return failedLatencyRecord(plan, `did not start: ${started.message}`);
    const running = started;
    try {
      const channel = await connection.createConfirmChannel();
      const measured = publishes.length * (1 - plan.warmupMs / 1000 / (publishes.length / plan.rate));
      const every = Math.max(1, Math.round(measured / (plan.probeTarget ?? 1_000)));
      const outstanding: Probe[] = [];
      let publishing = true;

      // The prober runs beside the publisher on this event loop.
      const pollMs = plan.pollMs ?? 5;
      const prober = (async () => {
        if (!tally) return;
        while (publishing || outstanding.length > 0) {
          if (outstanding.length > 0) {
            // Take the batch out first: the publisher keeps appending while MGET is in flight.
            const batch = outstanding.splice(0, outstanding.length);
            const marked = await markedProbes(ctx, prefix, batch);
            const now = Date.now();
            const still: Probe[] = [];
            batch.forEach((probe, i) => {
              if (marked[i]) latencies.push(now - probe.publishedAt);
              else still.push(probe);
            });
            outstanding.unshift(...still);
          }
          await sleep(pollMs);
        }
      })();

      const started = performance.now();
      const measureFrom = Date.now() + plan.warmupMs;
      let sent = 0;
      while (sent < publishes.length) {
        const due = Math.min(publishes.length, Math.floor(((performance.now() - started) / 1000) * plan.rate));
        while (sent < due) {
          const publish = publishes[sent]!;
          const now = Date.now();
          const ok = channel.sendToQueue(queue, publish.body, {
            persistent: true,
            contentType: 'application/json',
            timestamp: now,
            ...(publish.messageId !== undefined ? { messageId: publish.messageId } : {}),
          });
          if (tally && sent % every === 0 && publish.id !== undefined && now >= measureFrom) outstanding.push(probeFor(ctx, publish.body, publish.id, now));
          sent++;
          if (!ok) await new Promise((resolve) => channel.once('drain', resolve));
        }
        await sleep(1);
      }
      achievedRate = publishes.length / ((performance.now() - started) / 1000);
      await channel.waitForConfirms();
      publishing = false;

      const deadline = sleep(Math.max(60_000, (publishes.length / 300) * 1000), 'timeout' as const, { ref: false });
      if (tally) {
        const finished = await Promise.race([prober.then(() => 'ok' as const), deadline]);
        if (finished === 'timeout') problem = `${outstanding.length} sampled message(s) never got their markers`;
        const watch = await connection.createChannel();
        const watched = await watchCounts(ctx, watch, queue, prefix, workload.truth);
        if (watched.at === null && problem === undefined) problem = `stalled with ${watched.pendingSkus} SKU(s) short`;
      } else {
        const report = await Promise.race([running.done, deadline]).catch((error: Error) => {
          problem = error.message;
          return null;
        });
        if (report === 'timeout') problem = 'no done report before the deadline';
        else if (report !== null) for (const [stamp, ms] of report.samples ?? []) if (stamp >= measureFrom) latencies.push(ms);
      }
    } finally {
      const exit = await running.stop();
      if (exit.code !== 0 && problem === undefined) problem = `exited with ${exit.code ?? exit.signal} on SIGTERM`;
    }
    const after = await queueState(ctx.amqpUrl, queue);
    if (after.messageCount !== 0 && problem === undefined) problem = `${after.messageCount} message(s) left in the queue`;
    if (contender !== 'ceiling') {
      const counts = await readCounts(ctx.redis, { prefix, virtualShards: ctx.virtualShards }, []);
      const check = compareWithTruth(counts, workload.truth);
      if (!check.exact) problem = `${problem ? `${problem}; ` : ''}counts: ${describeTruthCheck(check, counts, workload.truth)}`;
    }
  } finally {
    await connection.close().catch(() => {});
    await resetSpace(ctx, queue, prefix);
  }
  const summary = summarizeLatencies(latencies);
  return {
    contender,
    round: plan.round,
    loadFraction: plan.loadFraction,
    targetRate: plan.rate,
    achievedRate,
    published: publishes.length,
    samples: summary.samples,
    p50Ms: summary.p50,
    p99Ms: summary.p99,
    maxMs: summary.max,
    method: tally ? 'marker-probe' : 'ack',
    correct: problem === undefined,
    ...(problem !== undefined ? { problem } : {}),
  };
}
