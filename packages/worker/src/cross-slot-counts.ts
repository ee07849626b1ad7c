/**
 * Two-step mode, message-scoped markers on a Redis Cluster: step 2, the
 * count write, when a batch's counts span hash slots.
 *
 * A message-scoped batch is a marker shard's messages, whole, and each SKU's
 * count lives on its own virtual shard's slot (count-keys.ts). No script
 * can write across slots, so the counts are written per count shard: one
 * write_counts.lua per shard the batch touches, each with its own receipt
 * in that shard's slot (`<prefix>w:{<shard>}:<batch id>`), all of them
 * before the markers are occupied. The seed's order holds across slots:
 *
 *   claim (marker slot) -> counts, per count slot -> occupy (marker slot)
 *
 * - Write before occupy (invariant 2): the occupation is sent only once
 *   every shard's write answered `written` or `receipt`.
 * - Receipts: each shard's write is all or nothing in its slot, and a rerun
 *   under the same batch id finds its receipt and writes nothing twice, so
 *   a retry after a lost reply or a failed sibling shard is safe.
 * - The crash window is the same one as for a single slot: from the first
 *   shard's write to the occupation, one per batch, held in the window gauge
 *   by the caller. A SIGKILL in it re-counts the batch's messages on every
 *   shard already written (the overcount `tally deviation` bounds).
 * - A part Redis refuses on one shard (WRONGTYPE, an overflow) counted
 *   nothing there but may have counted on the others: its increments there
 *   are undone (the same deltas negated, under a receipt per part:
 *   takeBackReceiptId), so a refused message counts nothing anywhere and its replay
 *   counts it once. Counts are sums: the undo is exact. Only a key that
 *   changed between the write and the undo (turned foreign, or pushed to
 *   the edge of the 64-bit range) can refuse it; then those counts stand,
 *   `undo_failures` counts the parts and the error line names each key and
 *   the delta to subtract before the dead letter is replayed.
 * - A shard whose write fails for its data (not a part refused inside the
 *   script: a receipt key of a foreign type, say) fails the batch, which
 *   batch isolation splits and reruns under new ids. What the other shards
 *   wrote under this id is taken back first, so the halves count it once.
 * - Durability with TALLY_REDIS_WAIT_REPLICAS=N: before the occupation each
 *   shard's receipt is touched (EXPIRE, a write on the same connection) and
 *   WAITed for, so no marker is occupied while counts it stands for live on
 *   a master alone. A receipt that is gone there (a failover lost it, and
 *   the counts written with it in the same script) is written again as the
 *   lost write was: the parts refused there stay refused, and the new
 *   receipt says so (write_counts.lua's 'rewrite' layout). Deciding again
 *   would count a part whose refusing key the failover lost too, after the
 *   other shards undid it: counted twice on that shard once replayed.
 */
import {
  classifyError,
  describeError,
  receiptKey,
  ScriptReply,
  shardOf,
  PART_NEW,
  countKey,
  standingKey,
  taskDigests,
  type BatchTask,
  type CountRefusal,
  type PartChanges,
  type WorkerSettings,
} from '@tally/shared';
import { onSlotConnection, type RedisClient } from '@tally/runtime';
import { addToSum, type Sum } from './aggregate.js';
import type { BatchLog } from './batch-log.js';
import { countTtlOf } from './count-ttl.js';
import { decodeRefusals } from './count-refusals.js';
import { evalshaArgs, loadScript, runScript, type LuaScript, type ScriptArg } from './lua-scripts.js';
import { BatchWritesLostError, waitAfterTouch, type OnWaitTimeout } from './replica-wait.js';
import { adoptedParts, BatchFencedError, chainOf, chainsWriteArgs, digestArg, FENCE_VALUE } from './fenced-adoption.js';

type Reply = [string, string, unknown];

const NONE_ADOPTED: ReadonlySet<number> = new Set();

/**
 * How long a write or take-back receipt lives. With fenced adoption, as long
 * as the claim an adopter may find: the marker TTL from the end of the
 * claim's bucket. A receipt gone while its claim is still found would be
 * fenced, and its counts written again.
 */
function receiptTtlOf(settings: Pick<WorkerSettings, 'markerTtlS' | 'markerBucketS' | 'fencedAdoption'>): number {
  return settings.fencedAdoption === true ? settings.markerTtlS + settings.markerBucketS : settings.markerTtlS;
}

/** The take-back of a shard's parts; its KEYS and ARGV documented in lua/take_back_counts.lua. */
export const TAKE_BACK_COUNTS = loadScript('take_back_counts');

/** One shard's write answered: its receipt, the parts Redis refused there, and those refusals as the script gave them. */
interface ShardWritten {
  readonly receipt: string;
  readonly refusals: CountRefusal[];
  /** As the receipt holds them: what a rewrite of this write passes to the script to reproduce it. */
  readonly raw: unknown;
  /** The receipt was there: an earlier run of the batch wrote this shard. */
  readonly found: boolean;
  /** Fenced adoption: the parts another batch of their chain counted here, which this one did not write (fenced-adoption.ts). */
  readonly adopted: ReadonlySet<number>;
}

/** The count writes of one count shard: its SKUs' sums, and which parts they came from. */
interface ShardWrite {
  readonly shard: number;
  readonly sums: Map<string, Sum>;
  /** The batch's new parts with changes on this shard (batch indexes). */
  readonly parts: number[];
}

export interface CrossSlotResult {
  /** Every touched shard has the batch's counts (written now or by an earlier attempt). */
  readonly wrote: boolean;
  readonly refusals: CountRefusal[];
  readonly retries: number;
  readonly waitTimeouts: number;
  /** Count shards the batch wrote to: its fan-out across slots. */
  readonly shards: number;
  /** Fenced adoption: parts adopted on at least one shard (counted there by another batch, not written again). */
  readonly adoptedParts: number;
}

export interface CrossSlotDeps {
  readonly redis: RedisClient;
  readonly settings: Pick<
    WorkerSettings,
    'prefix' | 'markerTtlS' | 'markerBucketS' | 'countTtlS' | 'virtualShards' | 'waitReplicas' | 'waitTimeoutMs' | 'fencedAdoption'
  >;
  readonly task: BatchTask;
  /** Fenced adoption: by part, the batches whose claims on it this batch took over (claim-parts.ts). */
  readonly chains?: ReadonlyMap<number, readonly string[]>;
  /** Fenced adoption: by count shard, the parts held by another batch's claim that have changes there (heldByShard). */
  readonly held?: ReadonlyMap<number, readonly number[]>;
  /** The batch's new parts by count shard (shardWritesOf). */
  readonly groups: readonly ShardWrite[];
  readonly writeCounts: LuaScript;
  readonly log: BatchLog;
  /** Retries an idempotent step until it is done (the batch's untilDone); `onFailure` runs on each failed attempt. */
  readonly untilDone: <T>(step: string, run: () => Promise<T>, onFailure?: () => void) => Promise<T>;
  readonly onWaitTimeout?: OnWaitTimeout;
  /** Undos Redis refused: `parts` refused parts have counts standing on another shard (BatchHooks.onUndoFailed). */
  readonly onUndoFailed?: (task: BatchTask, parts: number) => void;
}

/** The batch's new parts by count shard, for a thread that knows the shard count (checked: a guess would write counts where no reader looks). */
export function shardWritesOf(task: BatchTask, marked: Uint8Array, settings: Pick<WorkerSettings, 'virtualShards'>): ShardWrite[] {
  if (settings.virtualShards === undefined) throw new TypeError('message-scoped markers need the virtual shard count in the worker settings');
  return groupByCountShard(task.changes, marked, settings.virtualShards);
}

/** The batch's new parts grouped by the count shard of each change: pure. */
export function groupByCountShard(changes: readonly PartChanges[], marked: Uint8Array, virtualShards: number): ShardWrite[] {
  const byShard = new Map<number, ShardWrite>();
  for (let i = 0; i < changes.length; i++) {
    if (marked[i] !== PART_NEW) continue;
    for (const [sku, delta] of changes[i]!) {
      const shard = shardOf(sku, virtualShards);
      let write = byShard.get(shard);
      if (write === undefined) byShard.set(shard, (write = { shard, sums: new Map(), parts: [] }));
      write.sums.set(sku, addToSum(write.sums.get(sku), delta));
      if (write.parts[write.parts.length - 1] !== i) write.parts.push(i);
    }
  }
  return [...byShard.values()];
}

export async function writeCountsAcrossSlots(deps: CrossSlotDeps): Promise<CrossSlotResult> {
  const { redis, settings, task, groups, log } = deps;
  const { prefix } = settings;
  const receiptTtlS = receiptTtlOf(settings);
  // Checked by shardWritesOf, which made the groups.
  const shards = settings.virtualShards!;
  const ttl = countTtlOf(settings.countTtlS);
  let retries = 0;
  const countRetry = (): void => {
    retries++;
  };

  // A receipt lives the marker TTL; one shard's write or a take-back can retry longer (an OOM master), and the
  // receipts already written, the batch's and its take-backs', must not expire meanwhile, to be read as lost by the
  // WAIT or a rerun and written (or taken back) again. Each is kept alive from its first attempt on: one that landed
  // with its reply lost must not expire while the attempts after it are refused (EXPIRE creates nothing).
  const alive = keepAlive(deps);
  const run = async (receipt: string, keys: string[], argv: ScriptArg[]): Promise<Reply> => {
    alive.add(receipt);
    try {
      return await deps.untilDone(
        'write_counts',
        () =>
          onSlotConnection(
            redis,
            receipt,
            async (connection) => (await runScript(connection, deps.writeCounts, evalshaArgs(deps.writeCounts, keys, argv), log)) as Reply,
          ),
        countRetry,
      );
    } catch (error) {
      // Refused for its data (a receipt key of another type): that key is not ours to give a TTL.
      if (classifyError(error) === 'data') alive.remove(receipt);
      throw error;
    }
  };

  /**
   * One shard's write. `lost` is the answer of a first write whose receipt a failover lost, with its counts: the
   * rewrite reproduces that write, not decides it again. The parts refused there stay refused (the foreign key that
   * refused one may be lost too, and the others' undo of it is done), and the new receipt holds those refusals, for a
   * rerun to read as the first run's.
   */
  const fenced = settings.fencedAdoption === true;
  const digests = fenced ? taskDigests(task) : [];
  const writeGroup = async (group: ShardWrite, lost?: ShardWritten): Promise<ShardWritten> => {
    const receipt = receiptKey(prefix, group.shard, task.batchId);
    // Fenced adoption: a shard with adopted parts, or refusals to record by digest, takes the 'chains' layout (the
    // rewrite of a lost receipt too: it decides the adoptions again, as a failover may have lost what they relied on).
    const byChains = async (prior: unknown): Promise<Reply> => {
      const chainsWrite = chainsWriteArgs(
        prefix,
        shards,
        task,
        digests,
        group.shard,
        { parts: group.parts, held: deps.held?.get(group.shard) ?? [] },
        deps.chains,
        { countTtlS: ttl.ttlS, receiptTtlS },
        prior,
      );
      return run(receipt, chainsWrite.keys, chainsWrite.argv);
    };
    const answered = (reply: Reply): ShardWritten => {
      if (reply[0] === ScriptReply.WRITE_FENCED) {
        alive.remove(receipt);
        throw new BatchFencedError(receipt);
      }
      return {
        receipt,
        refusals: decodeRefusals(reply[2], prefix),
        raw: reply[2],
        found: reply[0] === ScriptReply.WRITE_RECEIPT,
        adopted: fenced ? adoptedParts(reply[1]) : NONE_ADOPTED,
      };
    };
    const chained = (): boolean => group.parts.some((i) => chainOf(deps.chains, i, task.batchId).length > 0);
    if (fenced && ((deps.held?.get(group.shard)?.length ?? 0) > 0 || (lost?.refusals.length ?? 0) > 0 || chained())) {
      return answered(await byChains(lost?.raw ?? []));
    }
    const keys = [receipt];
    const keyIndex = new Map<string, number>();
    const argv: Array<string | number> = [ttl.ttlS, receiptTtlS, 'sums', ''];
    for (const [sku, sum] of group.sums) {
      keys.push(countKey(prefix, group.shard, sku));
      keyIndex.set(sku, keys.length - 1);
      argv.push(sum.toString());
    }
    argv[3] = ttl.due(keys.slice(1), Date.now());
    const byPart = (head: Array<string | number>, left: ReadonlySet<number>) => {
      // As for one slot (two-step-batch.ts): each part as its own all-or-nothing group, so only refused parts are left out.
      for (const i of group.parts) {
        if (left.has(i)) continue;
        const mine = task.changes[i]!.filter(([sku]) => shardOf(sku, shards) === group.shard);
        head.push(i + 1, mine.length);
        for (const [sku, delta] of mine) head.push(keyIndex.get(sku)!, String(delta));
      }
      return head;
    };
    let reply: Reply;
    if (lost !== undefined && lost.refusals.length > 0) {
      const refusedThere = new Set(lost.refusals.map((refusal) => refusal.part));
      reply = await run(receipt, keys, byPart([ttl.ttlS, receiptTtlS, 'rewrite', task.changes.length, JSON.stringify(lost.raw)], refusedThere));
    } else {
      reply = await run(receipt, keys, argv);
      if (reply[0] === ScriptReply.WRITE_ISOLATE) {
        reply = fenced ? await byChains([]) : await run(receipt, keys, byPart([ttl.ttlS, receiptTtlS, 'parts', task.changes.length], new Set()));
      }
    }
    return answered(reply);
  };

  // Every shard at once: the writes go to their slots' masters concurrently. All of them are let finish: a shard
  // whose write failed for its data may leave others written, and those are taken back before the batch fails.
  try {
    const settled = await Promise.allSettled(groups.map((group) => writeGroup(group)));
    // Fenced: nothing is taken back and nothing occupied; what this batch wrote stands for its adopters (fenced-adoption.ts).
    const fencedOut = settled.find((outcome): outcome is PromiseRejectedResult => outcome.status === 'rejected' && outcome.reason instanceof BatchFencedError);
    if (fencedOut !== undefined) throw fencedOut.reason;
    const failed = settled.find((outcome): outcome is PromiseRejectedResult => outcome.status === 'rejected');
    if (failed !== undefined) {
      if (classifyError(failed.reason) === 'data') await abandonWrittenShards(deps, groups, settled, { alive, onRetry: countRetry });
      throw failed.reason;
    }
    const writes = settled.map((outcome) => (outcome as PromiseFulfilledResult<ShardWritten>).value);
    const refusals = writes.flatMap((shardWrite) => shardWrite.refusals);
    if (writes.some((shardWrite) => shardWrite.found)) refusals.push(...(await refusalsTakenBackBefore(deps, groups, writes, refusals)));

    let standing = new Map<number, Record<string, string>>();
    let takeBackReceipts: string[][] = [];
    if (refusals.length > 0) {
      const undone = await undoRefusedParts(deps, groups, writes, refusals, { alive, onRetry: countRetry });
      takeBackReceipts = undone.receiptsByShard;
      standing = undone.standingByPart;
    }

    // A rewrite's refusals beyond the lost write's are parts the other shards counted and nobody undid: the WAIT fails
    // the batch for a rerun to undo them.
    const rewriteOf = (index: number) => async () => {
      const lost = writes[index]!;
      const refusedThen = new Set(lost.refusals.map((refusal) => refusal.part));
      return (await writeGroup(groups[index]!, lost)).refusals.filter((refusal) => !refusedThen.has(refusal.part));
    };
    // The records' WAITs and the receipts' together: each receipt's loop touches it on every attempt, so a record
    // waiting long on its own master (a replica down) cannot leave the receipts untouched past their TTL, to be read
    // as lost to a failover and their counts written again.
    const waitTimeouts = await allWaits((until) => [
      recordStanding(deps, standing, ttl.ttlS, until),
      ...(settings.waitReplicas > 0
        ? [
            ...writes.map((write, index) => waitForReceipts(deps, [write.receipt], rewriteOf(index), until)),
            ...takeBackReceipts.map((receipts) => waitForReceipts(deps, receipts, undefined, until)),
          ]
        : []),
    ]);
    const reported = dedupeByPart(refusals).map((refusal) => {
      const stands = standing.get(refusal.part);
      return stands === undefined ? refusal : { ...refusal, standing: stands };
    });
    const adoptedParts = new Set(writes.flatMap((write) => [...write.adopted])).size;
    return { wrote: groups.length > 0, refusals: reported, retries, waitTimeouts, shards: groups.length, adoptedParts };
  } finally {
    alive.stop();
  }
}

/**
 * Records each refused part's standing counts in Redis by its message's
 * digest, for the count TTL: the dead letter's header names them too, but
 * is lost when the message comes back before its dead copy is confirmed
 * (a channel that dies, a daemon killed), and the message refused again
 * then has nothing to undo and a dead letter without them. `tally dead
 * replay` reads the record (replay-guard.ts). A rerun writes the same.
 * With WAIT, each record is written and WAITed for on its own slot's
 * master: it has no hash tag, so on a cluster the receipts' WAITs, on
 * other masters, do not cover it, and a failover that lost it would let a
 * replay count what stands twice. Resolves to the WAITs that timed out.
 */
async function recordStanding(deps: CrossSlotDeps, standing: ReadonlyMap<number, Record<string, string>>, ttlS: number, until: AbortSignal): Promise<number> {
  // Most batches have nothing standing: no digest is computed for them.
  if (standing.size === 0) return 0;
  const { settings, task, log } = deps;
  const digests = taskDigests(task);
  const timeouts = await Promise.all(
    [...standing].map(async ([part, counts]) => {
      const digest = digests[part]!;
      const key = standingKey(settings.prefix, Buffer.from(digest.buffer, digest.byteOffset, digest.byteLength).toString('hex'));
      try {
        return await writeStandingRecord(deps, key, counts, ttlS, until);
      } catch (error) {
        // The counts are written and the undo is done: failing the batch now would let isolation write them again.
        // The record is a second copy of what the dead letter's header names, so its loss is logged, not thrown.
        if (classifyError(error) !== 'data') throw error;
        log.error(
          { batchId: task.batchId, part, key, stand: counts, err: describeError(error) },
          "could not record a refused message's standing counts in Redis (the key holds another type): its dead letter's header still names them. " +
            'Delete the key; if the letter loses its header, subtract each delta under "stand" before replaying it',
        );
        return 0;
      }
    }),
  );
  return timeouts.reduce((sum, count) => sum + count, 0);
}

/** One standing record written (and, with WAIT, waited for on its own slot's master); resolves to the WAITs that timed out. */
async function writeStandingRecord(deps: CrossSlotDeps, key: string, counts: Record<string, string>, ttlS: number, until: AbortSignal): Promise<number> {
  const { redis, settings, task, log } = deps;
  if (settings.waitReplicas === 0) {
    await deps.untilDone('record_standing', () => onSlotConnection(redis, key, (connection) => connection.eval(...recordStandingArgs(key, counts, ttlS))));
    return 0;
  }
  return waitAfterTouch(
    redis,
    settings,
    task,
    {
      slotKey: key,
      until,
      // The record is written again with every WAIT: the same fields, so nothing can be missing after it.
      touch: async (connection) => {
        const replies = await connection
          .pipeline()
          .eval(...recordStandingArgs(key, counts, ttlS))
          .call('WAIT', settings.waitReplicas, settings.waitTimeoutMs)
          .exec();
        if (replies === null) return null;
        return [[replies[0]![0], 0], replies[1]!];
      },
      onMissing: () => {},
    },
    log,
    deps.onWaitTimeout ?? (() => {}),
  );
}

/**
 * HSET then EXPIRE in one script, so a kill between them cannot leave a
 * record no TTL removes, and a key of another type refuses the HSET and
 * stops the script before its EXPIRE (a MULTI would run it, and the key
 * the error line names would expire on its own). Sent as EVAL: the path
 * is rare, and the text is short.
 */
const RECORD_STANDING = "redis.call('HSET', KEYS[1], unpack(ARGV, 2))\nredis.call('EXPIRE', KEYS[1], ARGV[1])\nreturn 1";

function recordStandingArgs(key: string, counts: Record<string, string>, ttlS: number): [string, number, ...Array<string | number>] {
  return [RECORD_STANDING, 1, key, ttlS, ...Object.entries(counts).flat()];
}

/** One refusal per part (a part refused on two shards is reported once, as the scripts do for one slot). */
function dedupeByPart(refusals: CountRefusal[]): CountRefusal[] {
  const seen = new Set<number>();
  return refusals.filter((refusal) => !seen.has(refusal.part) && seen.add(refusal.part));
}

/** A count a refused message left on another shard because Redis refused its undo (a key changed since the write). */
interface StandingCount {
  readonly key: string;
  /** The increment that stands: what to subtract by hand. */
  readonly delta: string;
  readonly error: string;
  /** The part (batch index) taken back: the increment is its own share of the key. */
  readonly part: number;
}

/** Each refused part's own share of the increments that stand: count key -> that part's delta (for its dead letter). */
function standingByPartOf(standing: readonly StandingCount[]): Map<number, Record<string, string>> {
  const byPart = new Map<number, Record<string, string>>();
  for (const count of standing) {
    if (count.delta === '0') continue;
    let mine = byPart.get(count.part);
    if (mine === undefined) byPart.set(count.part, (mine = {}));
    mine[count.key] = count.delta;
  }
  return byPart;
}

/**
 * The receipt id under which `part` of a batch is taken back on a shard,
 * whichever path takes it back (a refusal on another shard, an abandon):
 * one per part, so a part is taken back once per shard whatever ran
 * before, and a rerun can still take back a part another part's undo did
 * not cover (one receipt per batch and shard, found by the rerun, undid
 * nothing more: a double count when the dead letter was replayed).
 */
export function takeBackReceiptId(batchId: string, part: number): string {
  return `${batchId}~undo:${part}`;
}

/**
 * A rerun's check, for the parts an earlier run of the batch took back on a
 * shard whose receipt this run found, while no receipt refuses them now:
 * their refusal went with a receipt a failover lost (and the key that
 * refused them with it), or the shard whose data failure made the earlier
 * run abandon was mended since. Counted as this run found them, they would
 * be counted where the receipt was written again and not where they were
 * taken back: a loss. They stay refused instead, with the take-back as the
 * reason: taken back on every shard (the take-backs done are found, not
 * done again) and dead-lettered, so their replay counts them once. Only a
 * rerun pays for it: one EXISTS per part on each shard whose receipt it found.
 */
async function refusalsTakenBackBefore(
  deps: CrossSlotDeps,
  groups: readonly ShardWrite[],
  writes: readonly ShardWritten[],
  refusals: readonly CountRefusal[],
): Promise<CountRefusal[]> {
  const { redis, settings, task } = deps;
  const refused = new Set(refusals.map((refusal) => refusal.part));
  const takenBack = new Map<number, number>();
  await Promise.all(
    groups.map(async (group, index) => {
      if (!writes[index]!.found) return;
      const candidates = group.parts.filter((part) => !refused.has(part));
      if (candidates.length === 0) return;
      const receipts = candidates.map((part) => receiptKey(settings.prefix, group.shard, takeBackReceiptId(task.batchId, part)));
      const exists = await deps.untilDone('find_take_backs', () =>
        onSlotConnection(redis, receipts[0]!, async (connection) => {
          const pipeline = connection.pipeline();
          for (const receipt of receipts) pipeline.exists(receipt);
          const replies = (await pipeline.exec()) ?? [];
          for (const [error] of replies) if (error) throw error;
          return replies.map(([, value]) => Number(value) === 1);
        }),
      );
      candidates.forEach((part, i) => {
        if (exists[i] === true) takenBack.set(part, group.shard);
      });
    }),
  );
  return [...takenBack]
    .sort(([a], [b]) => a - b)
    .map(([part, shard]) => ({
      part,
      key: '',
      sku: '',
      delta: '0',
      error:
        `TALLY_TAKEN_BACK an earlier run of this batch took this message back on count shard ${shard}, and no receipt refuses it now ` +
        '(its refusal was lost with a receipt in a failover, or a failing shard was mended since): refused for good, so that its replay counts it once',
    }));
}

/**
 * A part refused on one shard is undone on every shard that counted it:
 * the same deltas negated, under the part's take-back receipt in that slot
 * (takeBackReceiptId: a retry undoes once). Returns the undo receipts by
 * shard, for the replica wait.
 *
 * An undo of increments just made is refused only by a key that changed
 * since the write. Then each SKU is undone on its own, so every other key
 * is taken back and the receipt is written with the refusals: a rerun or a
 * WAIT finds it instead of undoing again. The increments that stand are
 * logged once per batch, with what to subtract, and counted (undo_failures)
 * when this run left them; a rerun that finds them in the receipt logs them
 * again but does not count them. So the count is at most once per part,
 * but for a failover that loses the undo receipt (the rerun undoes again),
 * and a thread that dies between the undo and the count leaves the parts
 * logged by its reruns, not counted. Each refused part's share of what
 * stands is returned for its dead letter, by a rerun too.
 */
async function undoRefusedParts(
  deps: CrossSlotDeps,
  groups: readonly ShardWrite[],
  written: ReadonlyArray<Pick<ShardWritten, 'refusals' | 'adopted'>>,
  refusals: readonly CountRefusal[],
  steps: TakeBackSteps,
): Promise<{ receiptsByShard: string[][]; standingByPart: Map<number, Record<string, string>> }> {
  const refused = new Set(refusals.map((refusal) => refusal.part));
  const byShard = await Promise.all(
    groups.map((group, index) => {
      const refusedHere = new Set(written[index]!.refusals.map((refusal) => refusal.part));
      return takeBackOnShard(
        deps,
        group,
        group.parts.filter((part) => refused.has(part) && !refusedHere.has(part)),
        steps,
        written[index]!.adopted,
      );
    }),
  );
  const undone = byShard.flat();
  reportStanding(deps, refusals, undone);
  return {
    receiptsByShard: receiptsByShardOf(byShard),
    standingByPart: standingByPartOf(undone.flatMap((undo) => undo.standing)),
  };
}

/** What one part's take-back on one shard did: its receipt, the increments it could not take back, and whether this run took back (not a rerun). */
interface TakeBack {
  /** null when the take-back failed for its data and wrote nothing: no receipt to wait for. */
  readonly receipt: string | null;
  readonly standing: StandingCount[];
  readonly now: boolean;
}

/** Each shard's take-back receipts (its writes went through): one WAIT loop per shard covers them. */
function receiptsByShardOf(byShard: ReadonlyArray<readonly TakeBack[]>): string[][] {
  return byShard
    .map((takeBacks) => takeBacks.flatMap((takeBack) => (takeBack.receipt === null ? [] : [takeBack.receipt])))
    .filter((receipts) => receipts.length > 0);
}

/** What a take-back runs with: the batch's keep-alive, which its receipts join from the first attempt, and its retry count. */
interface TakeBackSteps {
  readonly alive: KeepAlive;
  readonly onRetry: () => void;
}

/** take_back_counts.lua's reply, one entry per part (documented in the script). */
type TakeBackReply = Array<
  | [typeof ScriptReply.TAKE_BACK_TAKEN | typeof ScriptReply.TAKE_BACK_RECEIPT | typeof ScriptReply.TAKE_BACK_ADOPTED, unknown]
  | [typeof ScriptReply.TAKE_BACK_FOREIGN, string]
>;

/**
 * Takes back `parts`' increments on one count shard, in one call
 * (take_back_counts.lua): the same deltas negated, each part under its own
 * receipt in that shard's slot, so a rerun or another path takes back once.
 * An undo of increments just made is refused only by a key that changed
 * since the write; each increment is taken back on its own, so every other
 * key is, and the ones that stand are returned. A part whose receipt key
 * holds a foreign type is not taken back at all: all its increments stand.
 */
async function takeBackOnShard(
  deps: CrossSlotDeps,
  group: ShardWrite,
  parts: readonly number[],
  steps: TakeBackSteps,
  adoptedHere: ReadonlySet<number>,
): Promise<TakeBack[]> {
  if (parts.length === 0) return [];
  const { alive } = steps;
  const { redis, settings, task, log } = deps;
  const shards = settings.virtualShards!;
  const receipts = parts.map((part) => receiptKey(settings.prefix, group.shard, takeBackReceiptId(task.batchId, part)));
  const keys = [...receipts];
  const keyIndex = new Map<string, number>();
  const argv: Array<ScriptArg> = [countTtlOf(settings.countTtlS).ttlS, receiptTtlOf(settings), parts.length];
  if (settings.fencedAdoption === true) {
    // Fenced adoption: each part's digest, and for a part adopted here the chain it was adopted from, whose receipts
    // then no longer stand for it (take_back_counts.lua with 'chains').
    keys.push(receiptKey(settings.prefix, group.shard, task.batchId));
    argv.push('chains');
    const digests = taskDigests(task);
    for (const part of parts) {
      const digest = digests[part]!;
      const chain = adoptedHere.has(part) ? chainOf(deps.chains, part, task.batchId) : [];
      argv.push(digestArg(digest), chain.length);
      for (const id of chain) {
        keys.push(receiptKey(settings.prefix, group.shard, id));
        argv.push(keys.length);
      }
    }
  }
  const negatedByPart = parts.map((part) => {
    const negated = new Map<string, Sum>();
    for (const [sku, delta] of task.changes[part]!) if (shardOf(sku, shards) === group.shard) negated.set(sku, addToSum(negated.get(sku), -delta));
    argv.push(negated.size);
    for (const [sku, delta] of negated) {
      let index = keyIndex.get(sku);
      if (index === undefined) {
        keys.push(countKey(settings.prefix, group.shard, sku));
        keyIndex.set(sku, (index = keys.length));
      }
      argv.push(index, String(delta));
    }
    return negated;
  });
  // Every part stands whole: its take-back wrote nothing (a foreign receipt key, or the whole call refused for its data).
  const standsWhole = (i: number, error: string): StandingCount[] =>
    [...negatedByPart[i]!].map(([sku, delta]) => ({
      key: countKey(settings.prefix, group.shard, sku),
      delta: (-BigInt(delta)).toString(),
      error,
      part: parts[i]!,
    }));
  for (const receipt of receipts) alive.add(receipt);
  let replies: TakeBackReply;
  try {
    replies = await deps.untilDone(
      'take_back_counts',
      () =>
        onSlotConnection(
          redis,
          receipts[0]!,
          async (connection) => (await runScript(connection, TAKE_BACK_COUNTS, evalshaArgs(TAKE_BACK_COUNTS, keys, argv), log)) as TakeBackReply,
        ),
      steps.onRetry,
    );
  } catch (error) {
    // Refused for its data before any write: every increment here stands. It is reported as standing like any
    // refused undo, not thrown: thrown after the writes, it sent the batch to isolation with nothing taken back, and
    // the halves counted it all again.
    if (classifyError(error) !== 'data') throw error;
    for (const receipt of receipts) alive.remove(receipt);
    return parts.map((_, i) => ({ receipt: null, standing: standsWhole(i, describeError(error)), now: true }));
  }
  return replies.map(([outcome, refusals], i) => {
    // An adopter owns the part here now (fenced adoption): nothing of it is this batch's to take back or to wait for.
    if (outcome === ScriptReply.TAKE_BACK_ADOPTED) return { receipt: null, standing: [], now: false };
    if (outcome === ScriptReply.TAKE_BACK_FOREIGN) {
      // That key is not ours to give a TTL.
      alive.remove(receipts[i]!);
      return { receipt: null, standing: standsWhole(i, refusals), now: true };
    }
    const standing = decodeRefusals(refusals, settings.prefix).map((refusal) => ({
      key: refusal.key,
      delta: (-BigInt(refusal.delta)).toString(),
      error: refusal.error,
      part: parts[i]!,
    }));
    return { receipt: receipts[i]!, standing, now: outcome === ScriptReply.TAKE_BACK_TAKEN };
  });
}

/**
 * A count shard's write failed for its data (a receipt key holding a
 * foreign type, an argument the script rejects): the batch fails, and batch
 * isolation (batch-isolation.ts) reruns its halves under new ids, which
 * write every shard again. So what the other shards wrote under this id is
 * taken back first (under each part's take-back receipt: a rerun of this
 * id, which fails the same way, takes back nothing twice, nor a part a
 * refusal elsewhere already undid), and the isolation's "a failed
 * run leaves nothing to undo" holds across slots too. An increment whose
 * undo Redis refuses stands, and is logged, counted and recorded by
 * message as for a refused part. Were the failing shard mended between a
 * thread's death and the rerun of this id, the rerun would find the written
 * shards' receipts, their counts taken back: refusalsTakenBackBefore keeps
 * those parts refused, dead-lettered for a replay that counts them once.
 */
async function abandonWrittenShards(
  deps: CrossSlotDeps,
  groups: readonly ShardWrite[],
  settled: ReadonlyArray<PromiseSettledResult<Pick<ShardWritten, 'refusals' | 'adopted'>>>,
  steps: TakeBackSteps,
): Promise<void> {
  const byShard = await Promise.all(
    groups.map((group, index) => {
      const outcome = settled[index]!;
      if (outcome.status === 'rejected') return [];
      const refusedHere = new Set(outcome.value.refusals.map((refusal) => refusal.part));
      return takeBackOnShard(
        deps,
        group,
        // Only what this batch wrote: an adopted part's counts are the batch's it was adopted from, which may still
        // occupy its marker (it stalled, it did not die); the halves adopt them again.
        group.parts.filter((part) => !refusedHere.has(part) && !outcome.value.adopted.has(part)),
        steps,
        NONE_ADOPTED,
      );
    }),
  );
  const undone = byShard.flat();
  deps.log.warn(
    { batchId: deps.task.batchId, shards: byShard.filter((takeBacks) => takeBacks.length > 0).length },
    "a count shard refused the batch's write for its data: taking back what the other shards wrote before the batch is split",
  );
  // What stands is recorded by message: a one-part run becomes a count-refused dead letter with no header (the
  // failure is thrown, not returned), and `tally dead replay` must find the record or replay it blind.
  const standing = standingByPartOf(undone.flatMap((undo) => undo.standing));
  // The split halves write every shard again under new ids: an undo a failover lost would leave those counts twice.
  // A lost undo receipt fails the batch (BatchWritesLostError): its rerun under this id takes back again.
  const ttlS = countTtlOf(deps.settings.countTtlS).ttlS;
  await allWaits((until) => [
    recordStanding(deps, standing, ttlS, until),
    ...(deps.settings.waitReplicas > 0 ? receiptsByShardOf(byShard).map((receipts) => waitForReceipts(deps, receipts, undefined, until)) : []),
  ]);
  reportStanding(deps, [], undone, STANDING_AFTER_ABANDON);
}

/**
 * Refreshes the TTL of the receipts added, every third of the marker TTL,
 * until stopped. EXPIRE creates nothing: a receipt a failover lost stays
 * lost, for the WAIT to find. A refresh that fails is not retried: the next
 * one, or the WAIT's own touch, comes before the TTL runs out.
 */
interface KeepAlive {
  add(receipt: string): void;
  remove(receipt: string): void;
  stop(): void;
}

function keepAlive(deps: CrossSlotDeps): KeepAlive {
  const { redis, settings } = deps;
  const receipts = new Set<string>();
  const timer = setInterval(
    () => {
      for (const receipt of receipts) onSlotConnection(redis, receipt, (connection) => connection.expire(receipt, receiptTtlOf(settings))).catch(() => {});
    },
    Math.max(100, (receiptTtlOf(settings) * 1000) / 3),
  );
  return {
    add: (receipt) => receipts.add(receipt),
    remove: (receipt) => receipts.delete(receipt),
    stop: () => clearInterval(timer),
  };
}

/**
 * A batch's concurrent WAIT loops (and standing records), summed: the WAITs
 * that timed out. The first to fail stops the others: each would otherwise
 * wait on, touching and logging, for a batch whose rerun waits again.
 */
async function allWaits(start: (until: AbortSignal) => Array<Promise<number>>): Promise<number> {
  const stop = new AbortController();
  try {
    const counts = await Promise.all(start(stop.signal));
    return counts.reduce((sum, count) => sum + count, 0);
  } catch (error) {
    stop.abort(error);
    throw error;
  }
}

const STANDING_AFTER_REFUSAL =
  'could not undo the counts of a refused message on another count shard (a key there changed since the write): those counts stand, an overcount tally deviation does not include. ' +
  'Repair each key under "stand", then subtract its delta (INCRBY key -delta) before replaying the dead letter, or the replay counts it again';
const STANDING_AFTER_ABANDON =
  "could not take back the counts a batch wrote on one count shard before another refused the batch's write (a key there changed since the write): " +
  'those counts stand and the batch, split, counts them again: an overcount tally deviation does not include. Repair each key under "stand", then subtract its delta (INCRBY key -delta)';

function sumByKey(standing: readonly StandingCount[]): Map<string, string> {
  const sums = new Map<string, bigint>();
  for (const count of standing) sums.set(count.key, (sums.get(count.key) ?? 0n) + BigInt(count.delta));
  return new Map([...sums].map(([key, sum]) => [key, sum.toString()]));
}

/** One error line per batch for the increments its undos left standing, and the count of the parts this run left so. */
function reportStanding(deps: CrossSlotDeps, refusals: readonly CountRefusal[], undone: readonly TakeBack[], message = STANDING_AFTER_REFUSAL): void {
  const standing = undone.flatMap((undo) => undo.standing);
  if (standing.length === 0) return;
  const parts = [...new Set(standing.map((count) => count.part))].sort((a, b) => a - b);
  const partsNow = new Set(undone.filter((undo) => undo.now).flatMap((undo) => undo.standing.map((count) => count.part)));
  deps.log.error(
    {
      batchId: deps.task.batchId,
      parts,
      // What the dead letters' x-tally-reason names, to match this line with them.
      refusedKeys: [...new Set(refusals.filter((refusal) => parts.includes(refusal.part)).map((refusal) => refusal.key))],
      // By key: each part is taken back on its own, so two parts' increments of one key stand as two counts.
      stand: Object.fromEntries(sumByKey(standing)),
      errors: Object.fromEntries(standing.map((count) => [count.key, count.error])),
      rerun: partsNow.size === 0,
    },
    message,
  );
  if (partsNow.size > 0) deps.onUndoFailed?.(deps.task, partsNow.size);
}

/**
 * Touches `receipts` (one slot's: a shard's write receipt, or its take-back
 * receipts) and WAITs on its master until the replicas have them, and so
 * everything their scripts wrote before them (replication is one ordered
 * stream per master). A write receipt that is gone is written again; a
 * take-back receipt that is gone fails the batch for a rerun under its id.
 * Resolves to the WAITs that timed out.
 */
function waitForReceipts(
  deps: CrossSlotDeps,
  receipts: readonly string[],
  rewrite: (() => Promise<readonly CountRefusal[]>) | undefined,
  until: AbortSignal,
): Promise<number> {
  const { redis, settings, task, log } = deps;
  return waitAfterTouch(
    redis,
    settings,
    task,
    {
      slotKey: receipts[0]!,
      until,
      // EXPIRE answers 1 for a receipt that is there: 'missing' counts the others. With fenced adoption a write
      // receipt that reads `fenced` is missing too: a failover lost it, and an adopter fenced its id since (the
      // rewrite is then answered `fenced`, and the batch runs again under a new id).
      touch: async (connection) => {
        const fencedRead = settings.fencedAdoption === true && rewrite !== undefined;
        const pipeline = connection.pipeline();
        for (const receipt of receipts) {
          pipeline.expire(receipt, receiptTtlOf(settings));
          if (fencedRead) pipeline.get(receipt);
        }
        const replies = await pipeline.call('WAIT', settings.waitReplicas, settings.waitTimeoutMs).exec();
        if (replies === null) return null;
        const touched = replies.slice(0, -1);
        const failed = touched.find(([error]) => error !== null);
        const step = fencedRead ? 2 : 1;
        let missing = 0;
        for (let j = 0; j < touched.length; j += step) {
          if (Number(touched[j]![1]) === 0 || (fencedRead && touched[j + 1]![1] === FENCE_VALUE)) missing++;
        }
        return [failed ?? [null, missing], replies[replies.length - 1]!];
      },
      onMissing: async () => {
        // A take-back's receipt went with the take-back: the rerun under the batch's id takes back again (the write
        // receipts say what was refused).
        if (rewrite === undefined) throw new BatchWritesLostError(`a take-back receipt of ${receipts.join(', ')} (and so the take-back) is`);
        const [receipt] = receipts;
        log.warn({ vshard: task.vshard, receipt }, "a count shard's receipt is gone before its replicas had it (a failover lost it): writing its counts again");
        // The rewrite answers only for this shard, after the others' undo was decided: a part it newly finds refused,
        // or a refusal of the whole write, is left to a rerun of the batch under its id, which reads every shard's
        // receipt and undoes or takes back as for a first run (a data error passed up would send the batch to
        // isolation, whose halves would write the other shards again).
        const newlyRefused = await rewrite().catch((error: unknown) => {
          if (classifyError(error) !== 'data') throw error;
          throw new BatchWritesLostError(`the receipt ${receipt} (written again and refused for its data: ${describeError(error)}) is`);
        });
        if (newlyRefused.length > 0)
          throw new BatchWritesLostError(`the receipt ${receipt} (written again, with parts Redis refused there to undo on the other shards) is`);
      },
    },
    log,
    deps.onWaitTimeout ?? (() => {}),
  );
}
