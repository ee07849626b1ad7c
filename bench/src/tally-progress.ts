/**
 * When a Tally drain is over.
 *
 * watchDaemon (the drains): by the daemon's own report, its /metrics
 * (TALLY_METRICS_PORT): deliveries received and not yet acked. Nothing
 * reads Redis meanwhile, so Redis's CPU over the drain is Tally's alone.
 * While the broker still holds ready messages of the phase watched (its
 * queue depth, `checkQueue`: a cost of RabbitMQ's, not Tally's), the daemon
 * is not asked anything; from then on its /metrics is read every few ms
 * until every delivery of the phase is acked: the clock stops at that
 * read, within one interval of the last ack. The warm-up's end is found the
 * same way, where the measured window starts.
 *
 * watchCounts (the latency runs): from outside, by Redis: every count of the
 * truth there and no ready message in the queue.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type amqp from 'amqplib';
import { countKey, shardOf } from '@tally/shared';
import type { AnyBenchContext } from './context.js';
import { parseDaemonProgress, type DaemonProgress } from './daemon-metrics.js';
import { keyGroups } from './key-groups.js';

export interface DaemonWatchPlan {
  /** http://127.0.0.1:<TALLY_METRICS_PORT>/metrics */
  readonly metricsUrl: string;
  readonly channel: amqp.Channel;
  readonly queue: string;
  /** Deliveries of the warm-up at the head of the queue (0: none). */
  readonly warmup: number;
  /** Deliveries in the queue in all, the warm-up's included. */
  readonly expected: number;
  /** Called as soon as the warm-up is seen acked: where the measured window starts (the caller samples CPU there). */
  readonly onWarm?: (at: number) => Promise<void>;
  /** The queue is a stream: the broker's count is every message it holds, read or not, so only the daemon's figures say where it is. */
  readonly stream?: boolean;
  readonly scrapeIntervalMs?: number;
  readonly brokerIntervalMs?: number;
  readonly stallMs?: number;
}

export interface DaemonWatch {
  /** Epoch ms of the read that saw the warm-up acked; null without a warm-up or on a stall before it. */
  readonly warmAt: number | null;
  /** Epoch ms of the read that saw every delivery acked; null on a stall. */
  readonly doneAt: number | null;
  /** /metrics reads made (each costs the daemon a little CPU). */
  readonly scrapes: number;
  /** The last progress the daemon reported, for a stall's message. */
  readonly last: DaemonProgress | null;
  /** What the reads at warmAt and doneAt saw (the window's batches: partsPerBatch). */
  readonly warm: DaemonProgress | null;
  readonly done: DaemonProgress | null;
}

export async function watchDaemon(plan: DaemonWatchPlan): Promise<DaemonWatch> {
  const scrapeMs = plan.scrapeIntervalMs ?? 10;
  const brokerMs = plan.brokerIntervalMs ?? 25;
  const stallMs = plan.stallMs ?? 15_000;
  let scrapes = 0;
  let last: DaemonProgress | null = null;
  let warm: DaemonProgress | null = null;
  const scrape = async (): Promise<DaemonProgress & { at: number }> => {
    scrapes++;
    const response = await fetch(plan.metricsUrl);
    const progress = parseDaemonProgress(await response.text());
    last = progress;
    return { ...progress, at: Date.now() };
  };
  // Until the broker's ready count is at most `left`; false on a stall (no change for stallMs).
  const readyAtMost = async (left: number): Promise<boolean> => {
    if (plan.stream === true) return true;
    let seen = Number.NaN;
    let since = Date.now();
    for (;;) {
      const { messageCount } = await plan.channel.checkQueue(plan.queue);
      if (messageCount <= left) return true;
      if (messageCount !== seen) [seen, since] = [messageCount, Date.now()];
      else if (Date.now() - since > stallMs) return false;
      await sleep(brokerMs);
    }
  };
  // Until the daemon reports `done`; the read that saw it, or null on a stall.
  const until = async (done: (p: DaemonProgress) => boolean): Promise<number | null> => {
    let seen = Number.NaN;
    let since = Date.now();
    for (;;) {
      const p = await scrape();
      if (done(p)) return p.at;
      if (p.acked !== seen) [seen, since] = [p.acked, Date.now()];
      else if (Date.now() - since > stallMs) return null;
      await sleep(scrapeMs);
    }
  };
  let warmAt: number | null = null;
  const stalled = (): DaemonWatch => ({ warmAt, doneAt: null, scrapes, last, warm, done: null });
  if (plan.warmup > 0) {
    if (!(await readyAtMost(plan.expected - plan.warmup))) return stalled();
    warmAt = await until((p) => p.acked >= plan.warmup);
    if (warmAt === null) return stalled();
    warm = last;
    await plan.onWarm?.(warmAt);
  }
  if (!(await readyAtMost(0))) return stalled();
  const doneAt = await until((p) => p.received >= plan.expected && p.inFlight === 0);
  return { warmAt, doneAt, scrapes, last, warm, done: doneAt === null ? null : last };
}

export interface WatchResult {
  /** Epoch ms when the drain was seen complete; null on a stall. */
  readonly at: number | null;
  /** Commands the watcher itself sent to Redis (subtracted from the contender's). */
  readonly ownCommands: number;
  readonly pendingSkus: number;
}

const MGET_CHUNK = 2_000;

export async function watchCounts(
  ctx: AnyBenchContext,
  channel: amqp.Channel,
  queue: string,
  prefix: string,
  truth: ReadonlyMap<string, number>,
  options: { intervalMs?: number; stallMs?: number } = {},
): Promise<WatchResult> {
  const intervalMs = options.intervalMs ?? 20;
  const stallMs = options.stallMs ?? 15_000;
  // Only SKUs not yet at their truth are read again: the set shrinks as the drain proceeds.
  let pending = [...truth].map(([sku, want]) => {
    const vshard = shardOf(sku, ctx.virtualShards);
    return { key: countKey(prefix, vshard, sku), vshard, want };
  });
  // On a cluster one MGET per shard (one slot); on a standalone server chunks of any keys.
  const bySlot = ctx.nodes.topology === 'cluster';
  let ownCommands = 0;
  let lastProgress = Date.now();
  for (;;) {
    const before = pending.length;
    const still: typeof pending = [];
    for (const chunk of keyGroups(pending, bySlot, MGET_CHUNK)) {
      const values = await ctx.redis.mget(chunk.map((p) => p.key));
      ownCommands++;
      chunk.forEach((p, j) => {
        if (Number(values[j] ?? 0) !== p.want) still.push(p);
      });
    }
    pending = still;
    if (pending.length === 0) {
      const { messageCount } = await channel.checkQueue(queue);
      if (messageCount === 0) return { at: Date.now(), ownCommands, pendingSkus: 0 };
    }
    if (pending.length < before) lastProgress = Date.now();
    else if (Date.now() - lastProgress > stallMs) return { at: null, ownCommands, pendingSkus: pending.length };
    await sleep(intervalMs);
  }
}
