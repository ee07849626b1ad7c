#!lua
--[[
  Atomic mode: one script per shard batch checks the markers, adds only the
  new parts' counts and occupies their markers, as one step no crash can split.

  Input:
    KEYS[1]                the batch's receipt
    KEYS[2 .. n+1]         the parts' markers
    KEYS[n+2 .. n+m+1]     the batch's count keys
    ARGV[1]                marker TTL, seconds (also the receipt's)
    ARGV[2]                count TTL, seconds
    ARGV[3]                n, the number of parts
    ARGV[4]                m, the number of count keys
    ARGV[5 ..]             per part: k, then k pairs
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
-- Where each part's k sits in ARGV, for the per-part pass after a refusal.
local partAt = {}
local pos = 5
for i = 1, n do
  local marker = KEYS[1 + i]
  local k = tonumber(ARGV[pos])
  if k == nil then return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. i .. ' has no change count') end
  partAt[i] = pos
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

local function negate(delta)
  if delta == '0' then return '0' end
  if string.sub(delta, 1, 1) == '-' then return string.sub(delta, 2) end
  return '-' .. delta
end

-- Keys an INCRBY succeeded on (so they hold an integer): the only ones that get the count TTL.
local touched = {}

-- Applies INCRBY keys[i] deltas[i] for every i, all or nothing. Returns nil,
-- or the position and error of the refused increment after taking back the
-- ones before it (the inverse of an increment that succeeded cannot fail). A
-- key taken back to 0 is deleted: the INCRBY may have created it, and a
-- count of 0 reads the same as no key.
local function addAll(keys, deltas)
  for i = 1, #keys do
    local reply = redis.pcall('INCRBY', keys[i], deltas[i])
    if type(reply) == 'table' and reply.err then
      for j = i - 1, 1, -1 do
        if redis.call('INCRBY', keys[j], negate(deltas[j])) == 0 then redis.call('DEL', keys[j]) end
      end
      return i, reply.err
    end
    touched[keys[i]] = true
  end
  return nil
end

-- Never tostring (it writes 1e+15), and never '-0' (Redis refuses it).
local function decimal(sum)
  if sum == 0 then return '0' end
  return string.format('%.0f', sum)
end

-- The usual case: the whole batch as one group, one INCRBY per SKU (and per spill).
local keys, deltas = {}, {}
for _, spill in ipairs(spills) do
  keys[#keys + 1] = KEYS[1 + n + spill[1]]
  deltas[#deltas + 1] = decimal(spill[2])
end
for index, sum in pairs(sums) do
  keys[#keys + 1] = KEYS[1 + n + index]
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
        partKeys[c] = KEYS[1 + n + tonumber(ARGV[at + 2 * c - 1])]
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
for i = 1, n do
  if flags[i] == '0' then redis.call('SET', KEYS[1 + i], '1', 'EX', markerTtl) end
end
local result = table.concat(flags)
local receipt = result
if #refusals > 0 then receipt = result .. ':' .. cjson.encode(refusals) end
redis.call('SET', KEYS[1], receipt, 'EX', markerTtl)
return {result, refusals, 0}
