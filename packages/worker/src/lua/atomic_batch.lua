#!lua
--[[
  Atomic mode: one script per shard batch checks the markers, adds only the
  new parts' counts and occupies their markers, as one step no crash can split.

  Input:
    KEYS[1]                the batch's receipt
    KEYS[2]                the shard's marker base, <prefix>mk:{<vshard>}; the
                           script reads and writes <base>:<bucket>:<sub> and
                           <base>:<bucket>:m (the same hash tag, so the same
                           slot on a cluster)
    KEYS[3 .. m+2]         the batch's count keys
    ARGV[1]                marker TTL, seconds (also the receipt's)
    ARGV[2]                count TTL, seconds
    ARGV[3]                n, the number of parts
    ARGV[4]                m, the number of count keys
    ARGV[5]                bucket width, seconds
    ARGV[6]                sub-buckets of a shard's bucket when the bucket
                           before it is unknown (a power of two)
    ARGV[7 ..]             per part: its 16-byte digest, k, then k pairs
                           (count key index 1..m, delta as a decimal string)

  Output:
    {flags, refusals, replayed}
      flags        one character per part: '0' counted now, '1' a duplicate,
                   '2' refused by Redis (counted nothing, no marker)
      refusals     one {part index, count key, delta, Redis error} per
                   refused part (the first change Redis refused in it)
      replayed     1 when the receipt answered: the batch had already run

  Errors:
    TALLY_SCRIPT_ARGS  the keys and arguments disagree; nothing was written

  - Markers are fields of time-bucketed hashes (shared/src/markers.ts): a
    part is a duplicate when its digest is done ('1') in any live bucket.
    (A two-step marker holds its batch's number instead; a prefix switches
    mode only once no marker is live, so atomic mode never meets one.) New
    markers go to the bucket of now (TIME, the server's clock), whose hashes
    expire at the bucket's end plus the marker TTL. Each bucket's meta hash
    <base>:<bucket>:m holds its sub-bucket count `s` (fixed by the first
    script that writes to it, from `n` of the bucket before), `n`, the
    markers written to it, and `x`, which of its hashes already carry their
    expiry (as in claim_markers.lua). Reads and writes are grouped by hash.
  - Everything that can fail for a bad argument is checked in the first
    pass, before any write: Redis does not roll back a script that errors
    halfway, so an error must come before the first write or not at all.
  - Lua numbers are doubles. Deltas arrive as strings and are summed per SKU
    only while the sum stays within +-(2^53-1), where doubles are exact; a sum
    that would leave that range is spilled as its own INCRBY first. Sums are
    sent to INCRBY formatted with %.0f (never tostring, which writes 1e+15),
    and Redis parses them as 64-bit integers.
  - Refusals: INCRBY runs under pcall, and is refused for a
    foreign value in a count key (WRONGTYPE, not an integer) or a 64-bit
    overflow. A refused part must count nothing and occupy no marker, so that
    its replay from the dead-letter queue counts it once, while the batch's
    other parts are counted and marked. Increments are applied in groups, all
    or nothing (addAll: the applied ones are taken back with the inverse
    increment, inside this one script, so nobody sees the intermediate
    state). The usual case is one group, the whole batch summed per SKU; only
    when Redis refuses one of those sums is every new part applied again as
    its own group, and a part refused there is flagged '2'. Only keys on
    which an INCRBY succeeded get the count TTL: a foreign key is never
    touched.
  - The receipt (keyed by the coordinator's batch id) stores the result, so a
    rerun (a lost reply, a dead thread) returns the first answer instead of
    reporting the batch's own new parts as duplicates, and its refusals.
  - The `#!lua` line makes Redis refuse the whole script up front when it is
    out of memory, rather than at the first write inside it.
]]
local done = redis.call('GET', KEYS[1])
if done then
  -- 'flags', or 'flags:<refusals as JSON>' when a part was refused.
  local sep = string.find(done, ':', 1, true)
  if not sep then return {done, {}, 1} end
  return {string.sub(done, 1, sep - 1), cjson.decode(string.sub(done, sep + 1)), 1}
end
if redis.replicate_commands then redis.replicate_commands() end
local markerTtl = ARGV[1]
local countTtl = ARGV[2]
local n = tonumber(ARGV[3])
local m = tonumber(ARGV[4])
local width = tonumber(ARGV[5])
local initialSubs = tonumber(ARGV[6])
if n == nil or m == nil or width == nil or initialSubs == nil or #KEYS ~= 2 + m then
  return redis.error_reply('TALLY_SCRIPT_ARGS keys and part count disagree')
end
local base = KEYS[2]
local nowS = tonumber(redis.call('TIME')[1])
local current = math.floor(nowS / width)
local oldest = math.floor((nowS - tonumber(markerTtl)) / width)
local expiresAt = (current + 1) * width + tonumber(markerTtl)

-- @include marker_buckets

-- Which digests are done in any live bucket: one HMGET per hash and bucket, in chunks.
local all = {}
local walk = 7
for i = 1, n do
  local digest = ARGV[walk]
  local k = tonumber(ARGV[walk + 1])
  if digest == nil or #digest ~= 16 or k == nil then return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. i .. ' has no digest or no change count') end
  all[#all + 1] = digest
  walk = walk + 2 + 2 * k
end
local doneSet = {}
local currentSubs = readBuckets(current, oldest, all, function(_, digest, value)
  if value == '1' then doneSet[digest] = true end
end)

local SAFE = 9007199254740991
local flags = {}
local seen = {}
local sums = {}
local spills = {}
-- Where each part's k sits in ARGV, for the per-part pass after a refusal.
local partAt = {}
local digestOf = {}
local pos = 7
for i = 1, n do
  local marker = ARGV[pos]
  local k = tonumber(ARGV[pos + 1])
  digestOf[i] = marker
  partAt[i] = pos + 1
  pos = pos + 2
  if seen[marker] or doneSet[marker] then
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

-- @include count_apply

-- Never tostring (it writes 1e+15), and never '-0' (Redis refuses it).
local function decimal(sum)
  if sum == 0 then return '0' end
  return string.format('%.0f', sum)
end

-- The usual case: the whole batch as one group, one INCRBY per SKU (and per spill).
local keys, deltas = {}, {}
for _, spill in ipairs(spills) do
  keys[#keys + 1] = KEYS[2 + spill[1]]
  deltas[#deltas + 1] = decimal(spill[2])
end
for index, sum in pairs(sums) do
  keys[#keys + 1] = KEYS[2 + index]
  deltas[#deltas + 1] = decimal(sum)
end
local refusals = {}
if addAll(keys, deltas) then
  -- Nothing of the batch is counted now: each new part again, as its own group.
  for i = 1, n do
    if flags[i] == '0' then
      local at = partAt[i]
      local k = tonumber(ARGV[at])
      local partKeys, partDeltas = {}, {}
      for c = 1, k do
        partKeys[c] = KEYS[2 + tonumber(ARGV[at + 2 * c - 1])]
        partDeltas[c] = ARGV[at + 2 * c]
      end
      local failed, err = addAll(partKeys, partDeltas)
      if failed then
        flags[i] = '2'
        refusals[#refusals + 1] = {i, partKeys[failed], partDeltas[failed], err}
      end
    end
  end
end
for key in pairs(touched) do redis.call('EXPIRE', key, countTtl) end
local fresh = {}
for i = 1, n do
  if flags[i] == '0' then fresh[#fresh + 1] = digestOf[i] end
end
if #fresh > 0 then writeMarkers(current, currentSubs or openBucket(current, initialSubs, expiresAt), fresh, '1', expiresAt) end
local result = table.concat(flags)
local receipt = result
if #refusals > 0 then receipt = result .. ':' .. cjson.encode(refusals) end
redis.call('SET', KEYS[1], receipt, 'EX', markerTtl)
return {result, refusals, 0}
