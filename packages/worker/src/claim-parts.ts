/**
 * Two-step mode, step 1: which parts of a batch are new, each claimed for
 * this daemon. Natively where it can (native-claims.ts: one pipeline of
 * HSETNX, no Lua), by the claim script (claim_markers.lua) for the parts the
 * pipeline cannot decide (a digest a settled bucket's filter may hold, a
 * field already there) and for whole batches when the pipeline cannot be
 * trusted (near a bucket boundary, a filter not copied yet).
 *
 * A batch's new parts may so carry two claims: the pipeline's, in the bucket
 * of now under a claim id, and the script's, under its batch number. Each is
 * occupied on its own (occupy_markers.lua), after the counts.
 */
import { parsePartFlags, PART_DONE, PART_NEW, type WorkerSettings } from '@tally/shared';
import type { Redis } from 'ioredis';
import type { BatchLog } from './batch-log.js';
import { evalshaArgs, loadScript, runScript } from './lua-scripts.js';
import { nativeClaimsOf, NativeClaims, PART_PENDING } from './native-claims.js';
import { settledFiltersOf } from './settled-filters.js';

/** The claim script; its KEYS and ARGV documented in lua/claim_markers.lua. */
export const CLAIM_MARKERS = loadScript('claim_markers');

/** One claim of a batch: where its markers are, under which batch (a script's number or a pipeline's id), and which parts it holds. */
export interface BatchClaim {
  readonly bucket: number;
  readonly batch: number | string;
  readonly parts: readonly number[];
}

export interface ClaimedParts {
  /** Per part: PART_NEW (claimed now), PART_DONE, PART_HELD. */
  readonly marked: Uint8Array;
  /** Parts claimed over another daemon's expired claim. */
  readonly takeovers: number;
  readonly claims: readonly BatchClaim[];
  /** Parts the pipeline claimed without the script. */
  readonly nativeParts: number;
  /**
   * Fenced adoption (ClaimStep.adoptingAs): by part, the ids of the batches
   * whose claims on it this batch took over, oldest first; empty otherwise.
   */
  readonly chains: ReadonlyMap<number, readonly string[]>;
}

const NO_CHAINS: ReadonlyMap<number, readonly string[]> = new Map();

/** claim_markers.lua's chains (part index in the call, 1-based, then its ids joined by ' '), by batch part index. */
function chainsOf(reply: readonly unknown[], indices: readonly number[]): ReadonlyMap<number, readonly string[]> {
  if (reply.length === 0) return NO_CHAINS;
  const chains = new Map<number, readonly string[]>();
  for (let j = 0; j < reply.length; j += 2) chains.set(indices[Number(reply[j]) - 1]!, String(reply[j + 1]).split(' '));
  return chains;
}

export interface ClaimStep {
  readonly connection: Redis;
  readonly settings: WorkerSettings;
  readonly shardKey: string;
  readonly digests: readonly Uint8Array[];
  /** Bucket width, marker TTL, initial sub-buckets, filter bits: the scripts' ARGV[1..4]. */
  readonly bucketArgs: readonly number[];
  readonly log: Pick<BatchLog, 'warn'>;
  /** Fenced adoption's batch id (claim_markers.lua's ARGV[9]); none by default. */
  readonly adoptingAs?: string;
}

export async function claimParts(step: ClaimStep): Promise<ClaimedParts> {
  const { connection, settings, shardKey, digests, bucketArgs, log } = step;
  const filtered = bucketArgs[3]! > 0;
  const settled = filtered ? settledFiltersOf(settings.markerBucketS, settings.markerTtlS) : null;
  const native =
    settled !== null && settings.nativeClaims === true && step.adoptingAs === undefined
      ? nativeClaimsOf(settings.markerBucketS, settings.markerTtlS, settled.settleGraceS)
      : null;
  const warnCopy = (error: unknown): void =>
    log.warn({ shard: shardKey, err: String(error) }, 'could not read a marker bucket for native claims; the claim script probes it itself');

  const warnSweep = (error: unknown): void =>
    log.warn({ shard: shardKey, err: String(error) }, 'could not check the expiry of the older marker buckets; a later batch tries again');
  /** The claim script for the parts at `indices`: their states, and its claim. */
  const script = async (
    indices: readonly number[],
  ): Promise<{ marked: Uint8Array; takeovers: number; claim: BatchClaim & { batch: number }; chains: ReadonlyMap<number, readonly string[]> }> => {
    const sent = indices.map((i) => digests[i]!);
    const vouched = settled?.vouch(shardKey, sent);
    const args = evalshaArgs(
      CLAIM_MARKERS,
      [shardKey],
      [...bucketArgs, settings.claimToken, settings.claimTtlMs, vouched?.buckets ?? '', vouched?.flags ?? '', step.adoptingAs ?? '', ...(sent as Buffer[])],
    );
    const [flags, bucket, takeovers, batch, nowS, chains] = (await runScript(connection, CLAIM_MARKERS, args, log)) as [
      string,
      number,
      number,
      number,
      number,
      unknown[],
    ];
    settled?.observe(shardKey, nowS, connection, warnCopy);
    native?.observeSeconds(shardKey, nowS);
    native?.learnShape(shardKey, bucket, connection, warnCopy);
    native?.sweepBefore(shardKey, bucket, connection, warnSweep);
    const marked = parsePartFlags(flags, sent.length);
    return { marked, takeovers, claim: { bucket, batch, parts: indices.filter((_, j) => marked[j] === PART_NEW) }, chains: chainsOf(chains, indices) };
  };
  /** The whole batch decided by the script. */
  const byScript = async (): Promise<ClaimedParts> => {
    const all = await script(digests.map((_, i) => i));
    return { marked: all.marked, takeovers: all.takeovers, claims: all.claim.batch > 0 ? [all.claim] : [], nativeParts: 0, chains: all.chains };
  };

  const plan = native?.plan(shardKey, digests, settled!, settings.nativeClaimSkewMs) ?? null;
  if (plan === null) return byScript();
  const outcome = await native!.run(connection, plan, digests, settings.claimToken);
  if (outcome.staleCopy !== null) settled!.invalidate(shardKey, outcome.staleCopy);
  if (outcome.nowS > 0) settled!.observe(shardKey, outcome.nowS, connection, warnCopy);
  const warnForget = (error: unknown): void =>
    log.warn({ shard: shardKey, err: String(error) }, "could not delete a refused claim pipeline's record; its claims read as expired after the claim TTL");
  if (!outcome.accepted) {
    // The script decides every part, taking this daemon's pipeline claims
    // again where they stand (they read as its own); the record goes after
    // it, so whatever it did not take again reads as no claim.
    const decided = await byScript();
    await NativeClaims.forget(connection, plan, warnForget);
    return decided;
  }
  const marked = new Uint8Array(digests.length);
  const nativeClaimed: number[] = [];
  const pending: number[] = [];
  for (let i = 0; i < digests.length; i++) {
    const part = outcome.parts[i]!;
    if (part === PART_PENDING) pending.push(i);
    else if (part === PART_NEW) nativeClaimed.push(i);
    // A pending part's state is the script's, set below.
    marked[i] = part === PART_DONE ? PART_DONE : PART_NEW;
  }
  const claims: BatchClaim[] = [];
  if (nativeClaimed.length > 0) claims.push({ bucket: plan.bucket, batch: plan.id, parts: nativeClaimed });
  let takeovers = 0;
  if (pending.length > 0) {
    const rest = await script(pending);
    pending.forEach((i, j) => (marked[i] = rest.marked[j]!));
    takeovers = rest.takeovers;
    if (rest.claim.batch > 0) claims.push(rest.claim);
  }
  if (nativeClaimed.length === 0) await NativeClaims.forget(connection, plan, warnForget);
  // Native claims and fenced adoption do not mix (open-threads.ts): the pipeline's record names no batch.
  return { marked, takeovers, claims, nativeParts: nativeClaimed.length, chains: NO_CHAINS };
}
