/**
 * Records and checks a prefix's layout in `<prefix>layout` (virtual shards, shard hash, mode, marker format,
 * partitions), in one script, with a mode lease per daemon and the live-marker scan a mode switch needs.
 */
import { scanNodes, type RedisClient } from '@tally/runtime';
import {
  DEFAULTS,
  defaultBucketWidthS,
  LEGACY_MARKER_FORMAT,
  layoutKey,
  legacyMarkerScanPattern,
  FILTERED_MARKER_FORMAT,
  FENCED_MESSAGE_MARKER_FORMAT,
  MARKER_FORMAT,
  markerFormatOf,
  MarkerFormatRefusedError,
  markerScanPattern,
  markerScopeOf,
  MESSAGE_MARKER_FORMAT,
  type MarkerScope,
  ModeSwitchRefusedError,
  PartitionCountMismatchError,
  SHARD_HASH,
  ShardLayoutMismatchError,
  type TallyConfig,
  type TallyMode,
} from '@tally/shared';

export interface Layout {
  readonly virtualShards: number;
  readonly hash: string;
  readonly created: boolean;
  readonly mode: TallyMode;
  /** The mode recorded before this start, when this start switched the prefix to another one. */
  readonly switchedFrom: TallyMode | null;
  /** The prefix's marker layout (markers.ts), as recorded: every daemon of the prefix uses these, whatever its own settings. */
  readonly markers: MarkerLayout;
}

export interface MarkerLayout {
  readonly format: string;
  /** What one marker stands for, from the format (markers.ts MarkerScope). */
  readonly scope: MarkerScope;
  readonly bucketS: number;
  readonly subBuckets: number;
}

/**
 * A daemon's claim on the prefix's mode, kept as a field `lease:<id>` of the
 * layout hash with a server-clock expiry. While a lease of one mode is live,
 * no daemon can switch the prefix to the other: the switch is decided by the
 * same script that reads the leases, so a daemon that has just verified the
 * layout but not yet written a marker is seen. The heartbeat renews it; a
 * clean stop releases it; a crashed daemon's lease runs out after `ttlMs`.
 */
export interface ModeLease {
  readonly holder: string;
  readonly ttlMs: number;
}

/**
 * Prefixes laid out before the mode was recorded were run by two-step
 * daemons: the only mode there was.
 */
const MODE_OF_UNRECORDED_LAYOUT: TallyMode = 'two-step';

const LEASE_FIELD = 'lease:';

/**
 * Creates or verifies the layout in one step (one key, so one slot on a
 * cluster too). Everything a start decides about the layout happens here,
 * so daemons starting at the same instant on a new prefix see one winner:
 * the first script to run creates the record, every later one verifies it.
 *
 * KEYS[1] layout hash
 * ARGV: 1 virtual shards, 2 shard hash, 3 mode, 4 now (ISO, for created_at
 *       and mode_switched_at), 5 mode of a layout recorded before modes were,
 *       6 lease holder ('' for none), 7 lease ms, 8 '1' when the caller found
 *       no live marker and may switch the mode, 9 marker format, 10 marker
 *       bucket seconds, 11 marker sub-buckets (recorded only when the layout
 *       is created here; an older layout gets them from recordMarkerFormat)
 * Reply: { verdict, virtual_shards, hash, recorded mode, created 0|1, live
 *          leases of another mode, marker format, bucket s, sub-buckets ('' when
 *          not recorded) }, verdict one of 'ok', 'switched',
 *          'layout' (shards or hash differ), 'mode' (mode differs, no switch).
 *
 * TIME is the server's clock, so lease expiries do not depend on the clocks
 * of the machines the daemons run on. replicate_commands lets a script that
 * read TIME write on Redis 5 and 6 (effects replication is the default and
 * the call a no-op from Redis 7).
 */
const ENSURE_LAYOUT_LUA = `
if redis.replicate_commands then redis.replicate_commands() end
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local created = 0
if redis.call('EXISTS', key) == 0 then
  redis.call('HSET', key, 'virtual_shards', ARGV[1], 'hash', ARGV[2], 'created_at', ARGV[4], 'mode', ARGV[3],
    'marker_format', ARGV[9], 'marker_bucket_s', ARGV[10], 'marker_sub_buckets', ARGV[11])
  created = 1
else
  redis.call('HSETNX', key, 'virtual_shards', ARGV[1])
  redis.call('HSETNX', key, 'hash', ARGV[2])
  redis.call('HSETNX', key, 'created_at', ARGV[4])
  redis.call('HSETNX', key, 'mode', ARGV[5])
end
local shards = redis.call('HGET', key, 'virtual_shards')
local hash = redis.call('HGET', key, 'hash')
local mode = redis.call('HGET', key, 'mode')
local markers = redis.call('HMGET', key, 'marker_format', 'marker_bucket_s', 'marker_sub_buckets')
local format, bucketS, subBuckets = markers[1] or '', markers[2] or '', markers[3] or ''
if shards ~= ARGV[1] or hash ~= ARGV[2] then
  return { 'layout', shards, hash, mode, created, 0, format, bucketS, subBuckets }
end
local others = 0
local fields = redis.call('HGETALL', key)
for i = 1, #fields, 2 do
  local field = fields[i]
  if string.sub(field, 1, ${LEASE_FIELD.length}) == '${LEASE_FIELD}' then
    local held, expires = string.match(fields[i + 1], '^(%S+) (%d+)$')
    if expires == nil or tonumber(expires) <= now then
      redis.call('HDEL', key, field)
    elseif held ~= ARGV[3] then
      others = others + 1
    end
  end
end
local verdict = 'ok'
if mode ~= ARGV[3] then
  if ARGV[8] ~= '1' or others > 0 then
    return { 'mode', shards, hash, mode, created, others, format, bucketS, subBuckets }
  end
  redis.call('HSET', key, 'mode', ARGV[3], 'mode_switched_at', ARGV[4])
  verdict = 'switched'
end
if ARGV[6] ~= '' then
  redis.call('HSET', key, '${LEASE_FIELD}' .. ARGV[6], ARGV[3] .. ' ' .. (now + tonumber(ARGV[7])))
end
return { verdict, shards, hash, mode, created, others, format, bucketS, subBuckets }
`;

/**
 * KEYS[1] layout hash; ARGV: 1 marker format, 2 bucket s, 3 sub-buckets.
 * Records the marker format of a layout made before it was recorded, unless
 * another daemon did first; replies with what is recorded.
 */
const RECORD_MARKER_FORMAT_LUA = `
if redis.call('HSETNX', KEYS[1], 'marker_format', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'marker_bucket_s', ARGV[2], 'marker_sub_buckets', ARGV[3])
end
return redis.call('HMGET', KEYS[1], 'marker_format', 'marker_bucket_s', 'marker_sub_buckets')
`;

/**
 * KEYS[1] layout hash; ARGV: 1 holder, 2 mode, 3 lease ms. Renews a lease
 * only while the layout exists (a prefix wiped by an operator is not
 * re-created by a heartbeat). Reply 1 renewed, 0 no layout.
 */
const RENEW_LEASE_LUA = `
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], '${LEASE_FIELD}' .. ARGV[1], ARGV[2] .. ' ' .. (now + tonumber(ARGV[3])))
return 1
`;

type Verdict = 'ok' | 'switched' | 'layout' | 'mode';

interface ScriptReply {
  readonly verdict: Verdict;
  readonly virtualShards: string;
  readonly hash: string;
  readonly mode: TallyMode;
  readonly created: boolean;
  /** Live leases held by daemons of another mode. */
  readonly otherModeLeases: number;
  /** '' fields: not recorded (a layout from before marker formats). */
  readonly markerFormat: string;
  readonly markerBucketS: string;
  readonly markerSubBuckets: string;
}

/** The settings the layout check reads; the marker ones default as in config.ts. */
type LayoutConfig = Pick<TallyConfig, 'prefix' | 'virtualShards' | 'mode'> &
  Partial<Pick<TallyConfig, 'markerTtlS' | 'markerSubBuckets'>> & {
    /** The scope for a new prefix, resolved by topology (defaultMarkerScope) when TALLY_MARKER_SCOPE is not set; part when absent. */
    readonly markerScope?: MarkerScope | null;
    /** A new prefix of message scope is laid out for fenced adoption (needsFencedAdoption). */
    readonly fencedAdoption?: boolean;
  };

/** What a daemon with these settings records for a new prefix. */
function proposedMarkers(config: LayoutConfig): MarkerLayout {
  const scope = config.markerScope ?? 'part';
  return {
    format: markerFormatOf(scope, config.fencedAdoption === true),
    scope,
    bucketS: defaultBucketWidthS(config.markerTtlS ?? DEFAULTS.markerTtlS),
    subBuckets: config.markerSubBuckets ?? DEFAULTS.markerSubBuckets,
  };
}

async function runLayoutScript(redis: RedisClient, config: LayoutConfig, lease: ModeLease | null, maySwitch: boolean): Promise<ScriptReply> {
  const reply = (await redis.eval(
    ENSURE_LAYOUT_LUA,
    1,
    layoutKey(config.prefix),
    String(config.virtualShards),
    SHARD_HASH,
    config.mode,
    new Date().toISOString(),
    MODE_OF_UNRECORDED_LAYOUT,
    lease?.holder ?? '',
    String(lease?.ttlMs ?? 0),
    maySwitch ? '1' : '0',
    proposedMarkers(config).format,
    String(proposedMarkers(config).bucketS),
    String(proposedMarkers(config).subBuckets),
  )) as [Verdict, string, string, string, number, number, string, string, string];
  return {
    verdict: reply[0],
    virtualShards: reply[1],
    hash: reply[2],
    mode: reply[3] as TallyMode,
    created: reply[4] === 1,
    otherModeLeases: reply[5],
    markerFormat: reply[6],
    markerBucketS: reply[7],
    markerSubBuckets: reply[8],
  };
}

/**
 * Any live idempotency marker under the prefix, with its remaining TTL; null
 * when there is none. Both formats by default (a marker hash or a legacy
 * marker key); `legacyOnly` looks for legacy ones alone. Markers are spread
 * over every slot, so on a cluster every master is scanned.
 */
export async function findLiveMarker(redis: RedisClient, prefix: string, legacyOnly = false): Promise<{ key: string; ttlS: number } | null> {
  const patterns = legacyOnly ? [legacyMarkerScanPattern(prefix)] : [markerScanPattern(prefix), legacyMarkerScanPattern(prefix)];
  for (const pattern of patterns) {
    for (const node of scanNodes(redis)) {
      let cursor = '0';
      do {
        const [next, keys] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
        cursor = next;
        for (const key of keys) {
          const ttlS = await node.ttl(key);
          if (ttlS !== -2) return { key, ttlS };
        }
      } while (cursor !== '0');
    }
  }
  return null;
}

/** The recorded layout; null when none is recorded, and a scope of null for a format this build does not write. */
function markerLayoutOf(format: string, bucketS: string, subBuckets: string): (Omit<MarkerLayout, 'scope'> & { scope: MarkerScope | null }) | null {
  if (format === '') return null;
  return { format, scope: markerScopeOf(format), bucketS: Number(bucketS), subBuckets: Number(subBuckets) };
}

/**
 * The marker layout of a verified prefix. A layout made before marker formats
 * were recorded used one key per marker: it gets this build's format once no
 * such marker is live (a daemon reading only the new format would miss the
 * duplicates they record). A format this build does not know (a newer
 * build's) is refused.
 */
async function ensureMarkerFormat(redis: RedisClient, config: LayoutConfig, reply: ScriptReply): Promise<MarkerLayout> {
  const key = layoutKey(config.prefix);
  let recorded = markerLayoutOf(reply.markerFormat, reply.markerBucketS, reply.markerSubBuckets);
  if (recorded === null) {
    const live = await findLiveMarker(redis, config.prefix, true);
    if (live !== null) {
      const expiry = live.ttlS >= 0 ? `${live.key} expires in ${live.ttlS} s` : `${live.key} has no TTL and must be deleted by hand`;
      throw new MarkerFormatRefusedError(
        `prefix "${config.prefix}" holds live idempotency markers in the ${LEGACY_MARKER_FORMAT} format of an older Tally (${expiry}); this build writes ${proposedMarkers(config).format} and would miss the duplicates they record. ` +
          `Stop the older daemons and start again once their markers have expired (at most their TALLY_MARKER_TTL_S after their last write), or use a new TALLY_PREFIX.`,
      );
    }
    const proposed = proposedMarkers(config);
    const [format, bucketS, subBuckets] = (await redis.eval(
      RECORD_MARKER_FORMAT_LUA,
      1,
      key,
      proposed.format,
      String(proposed.bucketS),
      String(proposed.subBuckets),
    )) as [string | null, string | null, string | null];
    recorded = markerLayoutOf(format ?? '', bucketS ?? '', subBuckets ?? '');
  }
  if (recorded === null || recorded.scope === null || !(recorded.bucketS >= 1) || !(recorded.subBuckets >= 1)) {
    throw new MarkerFormatRefusedError(
      `prefix "${config.prefix}" records the marker format ${JSON.stringify(recorded?.format ?? '')} (Redis key ${key}), this build writes ${MARKER_FORMAT}, ${FILTERED_MARKER_FORMAT}, ${MESSAGE_MARKER_FORMAT} or ${FENCED_MESSAGE_MARKER_FORMAT}; run the build that laid it out, or use a new TALLY_PREFIX.`,
    );
  }
  return { ...recorded, scope: recorded.scope };
}

function liveDaemonRefusal(config: Pick<TallyConfig, 'prefix' | 'mode'>, recorded: TallyMode, count: number): ModeSwitchRefusedError {
  return new ModeSwitchRefusedError(
    `TALLY_MODE is ${config.mode} but prefix "${config.prefix}" runs in ${recorded} mode (Redis key ${layoutKey(config.prefix)}) and ${count} ` +
      `${recorded} daemon${count === 1 ? ' holds' : 's hold'} a live lease on it (see \`tally status\`). ` +
      `Daemons of both modes on one prefix can count a message twice in the two-step crash window, the double count atomic mode exists to rule out. ` +
      `Start this daemon with TALLY_MODE=${recorded}, or stop every ${recorded} daemon on this prefix and start again once its markers have expired, ` +
      `or use a new TALLY_PREFIX.`,
  );
}

/**
 * Records the layout of a prefix the first time a daemon starts on it, and
 * refuses to start when a later daemon disagrees:
 *
 * - virtual shards and shard hash (invariant 3): a mismatch would move SKUs
 *   between shards and let a redelivery skip or repeat parts;
 * - mode: both modes use the same marker keys, so markers of one are honoured
 *   by the other, but a message handled by daemons of both modes at once can
 *   still fall into the two-step crash window that atomic mode closes. A
 *   switch is refused while a daemon of the recorded mode holds a live lease
 *   or any marker of the prefix is live (a daemon of the old mode may have
 *   run until recently), and allowed once they have all expired, which takes
 *   at most the old mode's TALLY_MARKER_TTL_S after its last write.
 *
 * Creation, verification, the switch and taking the lease are each one
 * script, so daemons starting at the same instant cannot disagree: one
 * layout wins and every daemon with other settings refuses. The marker scan
 * cannot run inside a script (it spans the keyspace, and every slot on a
 * cluster), so a switch is two steps: scan, then a script that switches only
 * if the mode is still the old one and no daemon of it holds a lease. A
 * daemon of the old mode takes its lease before it writes any marker, so one
 * that starts between the two steps stops the switch.
 */
export async function ensureLayout(redis: RedisClient, config: LayoutConfig, lease: ModeLease | null = null): Promise<Layout> {
  const key = layoutKey(config.prefix);
  const first = await runLayoutScript(redis, config, lease, false);
  if (first.verdict === 'layout') {
    if (first.virtualShards !== String(config.virtualShards)) {
      throw new ShardLayoutMismatchError(
        `TALLY_VIRTUAL_SHARDS is ${config.virtualShards} but prefix "${config.prefix}" was laid out with ${first.virtualShards} virtual shards ` +
          `(Redis key ${key}). Changing it would move SKUs between shards and let redeliveries skip or repeat parts. ` +
          `Set TALLY_VIRTUAL_SHARDS=${first.virtualShards}, or use a new TALLY_PREFIX.`,
      );
    }
    throw new ShardLayoutMismatchError(
      `prefix "${config.prefix}" was laid out with shard hash "${first.hash}", this build uses "${SHARD_HASH}"; use a new TALLY_PREFIX.`,
    );
  }
  const layout = async (reply: ScriptReply, switchedFrom: TallyMode | null): Promise<Layout> => ({
    virtualShards: Number(reply.virtualShards),
    hash: SHARD_HASH,
    created: first.created,
    mode: config.mode,
    switchedFrom,
    markers: await ensureMarkerFormat(redis, config, reply),
  });
  if (first.verdict === 'ok') return layout(first, null);

  const recorded = first.mode;
  if (first.otherModeLeases > 0) throw liveDaemonRefusal(config, recorded, first.otherModeLeases);
  const live = await findLiveMarker(redis, config.prefix);
  if (live !== null) {
    const expiry =
      live.ttlS >= 0 ? `the one found, ${live.key}, expires in ${live.ttlS} s` : `the one found, ${live.key}, has no TTL and must be deleted by hand`;
    throw new ModeSwitchRefusedError(
      `TALLY_MODE is ${config.mode} but prefix "${config.prefix}" runs in ${recorded} mode (Redis key ${key}) and its idempotency markers are still live (${expiry}). ` +
        `A ${recorded} daemon may still be consuming: a message handled by daemons of both modes can be counted twice in the two-step crash window, ` +
        `the double count atomic mode exists to rule out, and the counters would mix two meanings. ` +
        `Stop every ${recorded} daemon on this prefix and start again once its markers have expired (at most its TALLY_MARKER_TTL_S after its last write), ` +
        `or use a new TALLY_PREFIX.`,
    );
  }
  const second = await runLayoutScript(redis, config, lease, true);
  if (second.verdict === 'switched') return layout(second, recorded);
  if (second.verdict === 'ok') return layout(second, null); // another daemon of this mode switched it first
  if (second.verdict === 'mode') throw liveDaemonRefusal(config, second.mode, Math.max(1, second.otherModeLeases));
  throw new ShardLayoutMismatchError(`the layout of prefix "${config.prefix}" changed while this daemon started (Redis key ${key}); start it again.`);
}

/** Renews a daemon's mode lease; false when the layout is gone (the prefix was wiped). */
export async function renewModeLease(redis: RedisClient, prefix: string, mode: TallyMode, lease: ModeLease): Promise<boolean> {
  return (await redis.eval(RENEW_LEASE_LUA, 1, layoutKey(prefix), lease.holder, mode, String(lease.ttlMs))) === 1;
}

/** Releases a daemon's mode lease on a clean stop, so a mode switch need not wait for it to run out. */
export async function releaseModeLease(redis: RedisClient, prefix: string, lease: ModeLease): Promise<void> {
  await redis.hdel(layoutKey(prefix), `${LEASE_FIELD}${lease.holder}`);
}

/**
 * KEYS[1] layout hash; ARGV[1] partitions. Records TALLY_PARTITIONS when the
 * layout has none (a new prefix, or one laid out before partitions) and
 * replies with what is recorded, or false when there is no layout.
 */
const PARTITIONS_LUA = `
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSETNX', KEYS[1], 'partitions', ARGV[1])
return redis.call('HGET', KEYS[1], 'partitions')
`;

/**
 * Checks TALLY_PARTITIONS against the number recorded for the prefix (the
 * first daemon that knows partitions records its own): a mismatch stops the
 * start with one line naming TALLY_PARTITIONS. Daemons with two numbers
 * would compute two owner maps, and the partitions one of them does not
 * know of could be left unconsumed. Changing the number is a procedure, in
 * docs/operations.md ("Changing TALLY_PARTITIONS").
 */
export async function ensurePartitionCount(redis: RedisClient, prefix: string, partitions: number): Promise<number> {
  const recorded = (await redis.eval(PARTITIONS_LUA, 1, layoutKey(prefix), String(partitions))) as string | null;
  if (recorded === null) throw new ShardLayoutMismatchError(`the layout of prefix "${prefix}" disappeared while this daemon started; start it again.`);
  if (Number(recorded) !== partitions) {
    throw new PartitionCountMismatchError(
      `TALLY_PARTITIONS=${partitions} but prefix "${prefix}" is laid out for ${recorded} partitions (Redis key ${layoutKey(prefix)}, field partitions); ` +
        `start with TALLY_PARTITIONS=${recorded}, or change it as docs/operations.md "Changing TALLY_PARTITIONS" describes`,
    );
  }
  return partitions;
}
