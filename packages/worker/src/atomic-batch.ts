/**
 * The atomic batch: one server-side script per shard batch checks the
 * markers, adds only the new parts' counts and occupies their markers, as one
 * step that no crash can split.
 *
 * The seed's premise is that a cache cannot write a count and an idempotency
 * key in one transaction. Redis runs a script atomically over keys that share
 * a hash slot, and every key of a virtual shard carries the hash tag
 * `{<vshard>}` (keys.ts), so the script is single-slot on Redis Cluster too.
 * There is no crash window left: a crash before the script leaves nothing
 * written, a crash after it leaves counts and markers written together, and a
 * second daemon running the same message at the same moment is serialised by
 * Redis and finds the first one's markers.
 *
 * How the script reaches Redis: lua-scripts.ts, as for the two-step
 * scripts (EVALSHA; SCRIPT LOAD on NOSCRIPT; a reload after the first logged).
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { countKey, describeError, retryUntilDone, markerKey, receiptKey, type BatchResult, type BatchTask, type WorkerSettings } from '@tally/shared';
import { defineScript, runScript } from './lua-scripts.js';
import type { BatchLog } from './two-step-batch.js';

/**
 * KEYS: [1] the batch's receipt, [2 .. n+1] the parts' markers, [n+2 .. n+m+1] the batch's count keys.
 * ARGV: marker TTL, count TTL, n, m, then per part: k, and k pairs (count key index 1..m, delta as a decimal string).
 * Returns {flags, countErrors, replayed}: flags has one character per part, '1' for a duplicate.
 *
 * - Everything that can fail for a bad argument is checked in the first
 *   pass, before any write: Redis does not roll back a script that errors
 *   halfway, so an error must come before the first write or not at all.
 * - Lua numbers are doubles. Deltas arrive as strings and are summed per SKU
 *   only while the sum stays within ±(2^53-1), where doubles are exact; a sum
 *   that would leave that range is spilled as its own INCRBY first. Sums are
 *   sent to INCRBY formatted with %.0f (never tostring, which writes 1e+15),
 *   and Redis parses them as 64-bit integers.
 * - INCRBY runs under pcall: an overflowing count or a foreign value in a
 *   count key is a refusal counted in countErrors, as in two-step mode, and
 *   does not stop the rest of the batch.
 * - The receipt stores the result, so a retry after a lost reply (the script
 *   ran, the answer never arrived) returns the first answer instead of
 *   reporting the batch's own new parts as duplicates.
 * - The `#!lua` line makes Redis refuse the whole script up front when it is
 *   out of memory, rather than at the first write inside it.
 */
export const ATOMIC_BATCH_SCRIPT = `#!lua
local done = redis.call('GET', KEYS[1])
if done then
  local sep = string.find(done, ':', 1, true)
  return {string.sub(done, 1, sep - 1), tonumber(string.sub(done, sep + 1)), 1}
end
local markerTtl = ARGV[1]
local countTtl = ARGV[2]
local n = tonumber(ARGV[3])
local m = tonumber(ARGV[4])
if n == nil or m == nil or #KEYS ~= 1 + n + m then
  return redis.error_reply('TALLY_SCRIPT_ARGS keys and part count disagree')
end
local SAFE = 9007199254740991
local flags = {}
local seen = {}
local sums = {}
local spills = {}
local pos = 5
for i = 1, n do
  local marker = KEYS[1 + i]
  local k = tonumber(ARGV[pos])
  if k == nil then return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. i .. ' has no change count') end
  pos = pos + 1
  if seen[marker] or redis.call('EXISTS', marker) == 1 then
    flags[i] = '1'
    pos = pos + 2 * k
  else
    flags[i] = '0'
    seen[marker] = true
    for _ = 1, k do
      local index = tonumber(ARGV[pos])
      local delta = tonumber(ARGV[pos + 1])
      if index == nil or index < 1 or index > m or delta == nil or delta ~= math.floor(delta) or math.abs(delta) > SAFE then
        return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. i .. ' has a bad change: ' .. tostring(ARGV[pos]) .. ' ' .. tostring(ARGV[pos + 1]))
      end
      pos = pos + 2
      local sum = sums[index]
      if sum == nil then
        sums[index] = delta
      elseif math.abs(sum + delta) > SAFE then
        spills[#spills + 1] = {index, sum}
        sums[index] = delta
      else
        sums[index] = sum + delta
      end
    end
  end
end
local countErrors = 0
local function add(index, sum)
  if sum == 0 then sum = 0 end
  local reply = redis.pcall('INCRBY', KEYS[1 + n + index], string.format('%.0f', sum))
  if type(reply) == 'table' and reply.err then countErrors = countErrors + 1 end
end
for _, spill in ipairs(spills) do add(spill[1], spill[2]) end
for index, sum in pairs(sums) do
  add(index, sum)
  redis.call('EXPIRE', KEYS[1 + n + index], countTtl)
end
for i = 1, n do
  if flags[i] == '0' then redis.call('SET', KEYS[1 + i], '1', 'EX', markerTtl) end
end
local result = table.concat(flags)
redis.call('SET', KEYS[1], result .. ':' .. countErrors, 'EX', markerTtl)
return {result, countErrors, 0}
`;

export const ATOMIC_BATCH = defineScript('atomic_batch', ATOMIC_BATCH_SCRIPT, 'redis lost the atomic batch script (restart or SCRIPT FLUSH); loading it again');
export const ATOMIC_BATCH_SHA = ATOMIC_BATCH.sha;

/** The EVALSHA arguments of a batch after the command name: SHA, number of keys, keys, then ARGV as documented on the script. */
export function atomicBatchArgs(settings: Pick<WorkerSettings, 'prefix' | 'markerTtlS' | 'countTtlS'>, task: BatchTask, batchId: string): Array<string | number> {
  const { prefix, markerTtlS, countTtlS } = settings;
  const { vshard, ids, changes } = task;
  const skuIndex = new Map<string, number>();
  const partArgs: Array<string | number> = [];
  for (const part of changes) {
    partArgs.push(part.length);
    for (const [sku, delta] of part) {
      let index = skuIndex.get(sku);
      if (index === undefined) {
        index = skuIndex.size + 1;
        skuIndex.set(sku, index);
      }
      // A string, so the script never sees a JavaScript double it would have to print back.
      partArgs.push(index, String(delta));
    }
  }
  // Built with push, not spread: a batch of 100,000 parts exceeds the arguments a call can take.
  const args: Array<string | number> = [ATOMIC_BATCH_SHA, 1 + ids.length + skuIndex.size, receiptKey(prefix, vshard, batchId)];
  for (const id of ids) args.push(markerKey(prefix, vshard, id));
  for (const sku of skuIndex.keys()) args.push(countKey(prefix, vshard, sku));
  args.push(markerTtlS, countTtlS, ids.length, skuIndex.size);
  for (const value of partArgs) args.push(value);
  return args;
}

export async function runAtomicBatch(redis: Redis, settings: WorkerSettings, task: BatchTask, log: BatchLog): Promise<BatchResult> {
  const t0 = performance.now();
  // One id for every attempt of this batch: a retry after a lost reply finds
  // the receipt the first attempt left and gets its answer back.
  const args = atomicBatchArgs(settings, task, randomUUID());
  let writeRetries = 0;
  const reply = (await retryUntilDone(() => runScript(redis, ATOMIC_BATCH, args, log), {
    // A `fatal` or `data` reply (a bad argument, NOPERM, a bug) would fail
    // the same way here: it goes to the coordinator, which logs it, retries
    // the batch and acks nothing of it meanwhile. Nothing was written: the
    // script checks before its first write.
    giveUp: (failureClass) => failureClass !== 'transient',
    // A lost connection or a transient reply: the script may or may not
    // have run; the receipt answers that on the next attempt.
    onAttemptFailed: ({ error, attempt, delayMs, failureClass }) => {
      writeRetries++;
      log.warn({ step: 'atomic_batch', vshard: task.vshard, attempt, delayMs, failureClass, err: describeError(error) }, 'redis step failed; retrying');
    },
  })) as [string, number, number];
  const [flags, countErrors] = reply;
  if (flags.length !== task.ids.length) throw new Error(`atomic batch: the script returned ${flags.length} flags for ${task.ids.length} parts`);
  const marked = new Uint8Array(task.ids.length);
  for (let i = 0; i < flags.length; i++) marked[i] = flags.charCodeAt(i) === 49 /* '1' */ ? 1 : 0;
  if (countErrors > 0) {
    log.error({ vshard: task.vshard, countErrors }, 'redis refused count increments (overflow or a non-integer value in a count key)');
  }
  const t1 = performance.now();
  return {
    vshard: task.vshard,
    marked,
    writeRetries,
    // There is no step between the count write and the marker occupation for
    // a crash to fall into: always 0 here, reported as not applicable (null)
    // by `tally stats` for an atomic prefix.
    occupationFailures: 0,
    countErrors,
    // One step: it is the count write and the marker occupation at once.
    timings: { precheckMs: 0, writeMs: t1 - t0, occupyMs: 0 },
  };
}
