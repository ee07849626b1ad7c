/**
 * Fenced adoption: atomic mode's promise (no double count after a crash)
 * on a Redis Cluster at two-step's cost, for prefixes of
 * FENCED_MESSAGE_MARKER_FORMAT (markers.ts). The design and its hazards:
 * bench/results/notes/cluster-floor.md.
 *
 * A batch runs as two-step runs across slots (claim in the marker's slot,
 * counts per count shard under a write receipt `w:{S}:<batch id>`, occupy).
 * Two-step's double count comes when a batch X dies (or stalls past the
 * claim TTL) after some count writes and before the occupation: the batch C
 * that claims the message next counts it again. Here C knows X, and asks
 * each count shard S, in the same script that writes C's own counts there
 * (write_counts.lua, 'chains'):
 *
 *   - no receipt of X on S: X never wrote S. C fences it (`fenced`), so X,
 *     if it is only slow, can never write S (write_counts answers
 *     `fenced`), and C counts the message there;
 *   - a receipt of X on S, the message not in `<receipt>~out` (what X
 *     refused or took back there): X counted it on S. C adopts it, writes
 *     nothing for it there, and records it in `<receipt>~adopted`, which
 *     X's own take-back then leaves alone.
 *
 * Every step of that is in S's slot, in one script, so X's writes and
 * take-backs there come wholly before or wholly after C's decision. How C
 * knows X: X's claim record names X's batch id, and the claim script
 * returns, for each part claimed over another batch's claim, its chain, the
 * ids of every batch whose claim on it was taken over, oldest first (C
 * adopts from X, then D from C: D asks about both).
 *
 * A batch answered `fenced` on any shard (BatchFencedError) stops without
 * occupying or taking anything back: what it wrote stands, for the adopters
 * of its messages to find. runTwoStepBatch runs the batch again under a new
 * id, which adopts this daemon's claims of the old one like any other.
 */
import { countKey, PART_HELD, receiptKey, shardOf, ScriptReply, type BatchTask } from '@tally/shared';
import type { ScriptArg } from './lua-scripts.js';

/** An adopter fenced this batch out of a count shard: it must not occupy, and runs again under a new id. */
export class BatchFencedError extends Error {
  constructor(receipt: string) {
    super(`an adopter fenced this batch out of a count shard (${receipt}): another batch took its claims over while it stalled`);
    this.name = 'BatchFencedError';
  }
}

/** What write_counts.lua writes into a receipt key it fences: the batch of that id may never write the shard. */
export const FENCE_VALUE = 'fenced';

/** A part's chain on one shard: the other batches' ids (never this batch's own: a rerun finds its own receipt). */
export function chainOf(chains: ReadonlyMap<number, readonly string[]> | undefined, part: number, batchId: string): readonly string[] {
  const chain = chains?.get(part);
  return chain === undefined ? [] : chain.filter((id) => id !== batchId);
}

/** The parts a 'chains' write adopted (flag '2' in its reply or receipt). */
export function adoptedParts(flags: string): Set<number> {
  const adopted = new Set<number>();
  for (let i = 0; i < flags.length; i++) if (flags[i] === ScriptReply.WRITE_PART_ADOPTED) adopted.add(i);
  return adopted;
}

/** A digest as a script argument: a Buffer over its bytes, not a copy. */
export function digestArg(digest: Uint8Array): Buffer {
  return Buffer.from(digest.buffer, digest.byteOffset, digest.byteLength);
}

/**
 * By count shard, the parts of a batch held by another batch's claim that
 * have changes there. A run that writes a shard without them must say so
 * (the 'chains' layout puts them in its `~out`): a rerun under this batch's
 * id may find a part held by the batch that took its claim over, and that
 * adopter, finding this receipt, would take it for the part's count.
 */
export function heldByShard(task: BatchTask, marked: Uint8Array, virtualShards: number): Map<number, number[]> {
  const held = new Map<number, number[]>();
  for (let i = 0; i < marked.length; i++) {
    if (marked[i] !== PART_HELD) continue;
    for (const shard of new Set(task.changes[i]!.map(([sku]) => shardOf(sku, virtualShards)))) {
      let parts = held.get(shard);
      if (parts === undefined) held.set(shard, (parts = []));
      parts.push(i);
    }
  }
  return held;
}

/** One count shard's write in the 'chains' layout: its KEYS and ARGV (write_counts.lua documents them). */
export function chainsWriteArgs(
  prefix: string,
  virtualShards: number,
  task: BatchTask,
  digests: readonly Uint8Array[],
  shard: number,
  { parts, held }: { parts: readonly number[]; held: readonly number[] },
  chains: ReadonlyMap<number, readonly string[]> | undefined,
  ttls: { countTtlS: number; receiptTtlS: number },
  prior: unknown,
): { keys: string[]; argv: ScriptArg[] } {
  const keys = [receiptKey(prefix, shard, task.batchId)];
  const indexOf = new Map<string, number>();
  // KEYS indexes, 1-based as the script reads them.
  const keyAt = (key: string): number => {
    let at = indexOf.get(key);
    if (at === undefined) {
      keys.push(key);
      indexOf.set(key, (at = keys.length));
    }
    return at;
  };
  const argv: ScriptArg[] = [ttls.countTtlS, ttls.receiptTtlS, 'chains', task.changes.length, JSON.stringify(prior), held.length];
  for (const i of held) argv.push(digestArg(digests[i]!));
  for (const i of parts) {
    const digest = digests[i]!;
    const chain = chainOf(chains, i, task.batchId).map((id) => keyAt(receiptKey(prefix, shard, id)));
    const mine = task.changes[i]!.filter(([sku]) => shardOf(sku, virtualShards) === shard);
    argv.push(i + 1, digestArg(digest), chain.length, ...chain, mine.length);
    for (const [sku, delta] of mine) argv.push(keyAt(countKey(prefix, shard, sku)), String(delta));
  }
  return { keys, argv };
}
