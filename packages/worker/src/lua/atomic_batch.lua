#!lua
--[[
  Atomic mode: checks a shard batch's markers, adds only the new parts'
  counts and occupies their markers, in one script. The key layout is in
  docs/architecture.md ("Redis keys"); how the script works, in its
  "The scripts" section.

  Input:
    KEYS[1]                the batch's write receipt
    KEYS[2]                the shard's marker base, <prefix>mk:{<vshard>}
    KEYS[3 .. m+2]         the batch's count keys
    ARGV[1]                marker TTL, seconds (also the receipt's)
    ARGV[2]                the TTL a count key gets, seconds
    ARGV[3]                n, the number of parts
    ARGV[4]                m, the number of count keys
    ARGV[5]                bucket width, seconds
    ARGV[6]                sub-buckets of a bucket whose bucket before is
                           unknown (a power of two)
    ARGV[7]                layout of the rest: 'sums' or 'parts'
    ARGV[8]                refresh: one character per count key, '1' when its
                           TTL is to be set even if it exists ('parts' and
                           the refusal path set every written key's TTL)
    ARGV[9]                filter bits per expected marker of a bucket it
                           opens (0: no filter)
    ARGV[10]               the buckets the worker probed itself, as in
                           claim_markers.lua ARGV[7]
    ARGV[11]               their flags, one character per part per bucket,
                           as in claim_markers.lua ARGV[8]
    'sums':  ARGV[12 .. m+11]    per count key, the sum of its deltas over
                                 all n parts, duplicates included (decimal)
             ARGV[m+12 .. 2m+11] per count key, how many changes of all n
                                 parts name it
             ARGV[2m+12 ..]      the parts, as below
    'parts': ARGV[12 ..]         the parts
    the parts              per part: its 16-byte digest, then its changes
                           as one string, 'index:delta' joined by ',' (count
                           key index 1..m, delta in decimal). One argument,
                           not 2k: Redis turns every argument into a Lua
                           string, and 'sums' reads a part's changes only
                           when it is a duplicate or refused.

  Output:
    {flags, refusals, replayed, now}
      flags        one character per part: '0' counted now, '1' a duplicate,
                   '2' refused by Redis (counted nothing, no marker)
      refusals     one {part index, count key, delta, Redis error} per
                   refused part (the first change Redis refused in it)
      replayed     1 when the receipt answered: the batch had already run,
                   and flags and refusals are the first run's
      now          the server's time, seconds (absent when replayed): which
                   buckets have settled

  Errors:
    TALLY_SCRIPT_ARGS  the keys and arguments disagree; nothing was written
    OOM                (the #!lua line) Redis is out of memory; nothing was
                       written
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
local layout = ARGV[7]
local function whole(x) return x ~= nil and x >= 0 and x == math.floor(x) end
if not whole(n) or not whole(m) or #KEYS ~= 2 + m then
  return redis.error_reply('TALLY_SCRIPT_ARGS keys and part count disagree')
end
-- Checked before any write: an EXPIRE refused after the INCRBYs would abort the script with counts written and no
-- receipt or marker, and batch isolation would count the parts again under new ids.
local function positive(x) return whole(x) and x > 0 end
if not positive(tonumber(markerTtl)) or not positive(tonumber(countTtl)) or not positive(width) or not positive(initialSubs) then
  return redis.error_reply('TALLY_SCRIPT_ARGS a TTL, the bucket width or the sub-bucket count is not a whole number > 0')
end
-- ARGV[sumAt + index] and ARGV[namedAt + index]: a count key's sum and how many changes name it ('sums').
local sumAt, namedAt, partsAt
local refresh = ARGV[8]
local filterBits = tonumber(ARGV[9])
if filterBits == nil then return redis.error_reply('TALLY_SCRIPT_ARGS no filter bits argument') end
if layout == 'sums' then
  sumAt, namedAt, partsAt = 11, 11 + m, 12 + 2 * m
elseif layout == 'parts' then
  partsAt = 12
else
  return redis.error_reply('TALLY_SCRIPT_ARGS unknown layout ' .. tostring(layout))
end
local base = KEYS[2]
local nowS = tonumber(redis.call('TIME')[1])
local current = math.floor(nowS / width)
local oldest = math.floor((nowS - tonumber(markerTtl)) / width)
local expiresAt = (current + 1) * width + tonumber(markerTtl)

-- @include marker_buckets

-- Which digests are done in any live bucket: one HMGET per hash and bucket, in chunks.
local all = {}
if #ARGV ~= partsAt + 2 * n - 1 then return redis.error_reply('TALLY_SCRIPT_ARGS the parts are not n digests and their changes') end
for i = 1, n do
  local digest = ARGV[partsAt + 2 * i - 2]
  if #digest ~= 16 then return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. i .. ' has no 16-byte digest') end
  all[i] = digest
end
local doneSet = {}
local currentSubs = readBuckets(current, oldest, all, function(_, digest, value)
  if value == '1' then doneSet[digest] = true end
end, vouchedBuckets(ARGV[10], ARGV[11], all))

local SAFE = 9007199254740991

-- Part i's changes: their count key indexes and deltas (numbers, and the
-- decimal strings as sent), or an error reply when one is not a change.
local function changesOf(i)
  local text = ARGV[partsAt + 2 * i - 1]
  local indexes, deltas, decimals = {}, {}, {}
  if text == '' then return indexes, deltas, decimals end
  for change in string.gmatch(text .. ',', '([^,]*),') do
    -- Canonical decimals only ('0', no leading zeros, no '-0', no '+'): the refusal path hands them to INCRBY as sent.
    local indexText, deltaText = string.match(change, '^([1-9]%d*):(%-?%d+)$')
    if deltaText and deltaText ~= '0' and string.match(deltaText, '^%-?0') then deltaText = nil end
    local index, delta = tonumber(indexText), tonumber(deltaText)
    if index == nil or index > m or delta == nil or math.abs(delta) > SAFE then
      return nil, nil, nil, redis.error_reply('TALLY_SCRIPT_ARGS part ' .. i .. " has a bad change: '" .. change .. "'")
    end
    indexes[#indexes + 1] = index
    deltas[#deltas + 1] = delta
    decimals[#decimals + 1] = deltaText
  end
  return indexes, deltas, decimals
end

local flags = {}
local seen = {}
local duplicates = {}
for i = 1, n do
  local marker = all[i]
  if seen[marker] or doneSet[marker] then
    flags[i] = '1'
    duplicates[#duplicates + 1] = i
  else
    flags[i] = '0'
    seen[marker] = true
  end
end

-- Never tostring (it writes 1e+15), and never '-0' (Redis refuses it).
local function decimal(sum)
  if sum == 0 then return '0' end
  return string.format('%.0f', sum)
end

-- @include count_apply

-- The batch as one group: keys[keyAt + i], deltas[deltaAt + i] for i = 1..count, `instead` as addAll takes it.
local keys, keyAt, deltas, deltaAt, count, instead

-- 'sums' with duplicates: their deltas taken off the sums, exactly, or false when doubles cannot do it exactly.
local function withoutDuplicates()
  local off, named = {}, {}
  for _, i in ipairs(duplicates) do
    local indexes, changeDeltas, _, bad = changesOf(i)
    if bad then return nil, bad end
    for c, index in ipairs(indexes) do
      local sum = (off[index] or 0) + changeDeltas[c]
      if math.abs(sum) > SAFE then return false end
      off[index] = sum
      named[index] = (named[index] or 0) + 1
    end
  end
  local replaced = {}
  for index, sum in pairs(off) do
    local left = tonumber(ARGV[namedAt + index])
    if left == nil then return nil, redis.error_reply('TALLY_SCRIPT_ARGS count key ' .. index .. ' has no change count') end
    if left <= named[index] then
      -- Named by duplicates only: not written, as if the batch had not named it.
      replaced[index] = false
    else
      local total = tonumber(ARGV[sumAt + index])
      if total == nil or total ~= math.floor(total) or math.abs(total) > SAFE or math.abs(total - sum) > SAFE then return false end
      replaced[index] = decimal(total - sum)
    end
  end
  return replaced
end

-- The new parts summed per SKU from their changes, every change checked ('parts', and 'sums' past what doubles hold exactly).
local function fromParts()
  local sums, spillKeys, spillDeltas = {}, {}, {}
  for i = 1, n do
    if flags[i] == '0' then
      local indexes, changeDeltas, _, bad = changesOf(i)
      if bad then return bad end
      for c, index in ipairs(indexes) do
        local delta = changeDeltas[c]
        local sum = sums[index]
        if sum == nil then
          sums[index] = delta
        elseif math.abs(sum + delta) > SAFE then
          spillKeys[#spillKeys + 1] = KEYS[2 + index]
          spillDeltas[#spillDeltas + 1] = decimal(sum)
          sums[index] = delta
        else
          sums[index] = sum + delta
        end
      end
    end
  end
  keys, keyAt, deltas, deltaAt = spillKeys, 0, spillDeltas, 0
  for index, sum in pairs(sums) do
    keys[#keys + 1] = KEYS[2 + index]
    deltas[#deltas + 1] = decimal(sum)
  end
  count = #keys
  return nil
end

local summed = false
-- Positions i of the group match the count keys only on the 'sums' path; fromParts() regroups them (refresh all).
local groupRefresh = nil
if layout == 'sums' then
  keys, keyAt, deltas, deltaAt, count = KEYS, 2, ARGV, sumAt, m
  groupRefresh = refresh
  if #duplicates > 0 then
    local replaced, bad = withoutDuplicates()
    if bad then return bad end
    summed = replaced ~= false
    instead = replaced or nil
  else
    summed = true
  end
end
if not summed then
  groupRefresh = nil
  local bad = fromParts()
  if bad then return bad end
end

local refusals = {}
if addAll(keys, keyAt, deltas, deltaAt, count, instead, groupRefresh) then
  -- Nothing of the batch is counted now: each new part again, as its own
  -- group, every change checked before the first is applied.
  local groups = {}
  for i = 1, n do
    if flags[i] == '0' then
      local indexes, _, decimals, bad = changesOf(i)
      if bad then return bad end
      local partKeys = {}
      for c, index in ipairs(indexes) do partKeys[c] = KEYS[2 + index] end
      groups[i] = {partKeys, decimals}
    end
  end
  for i = 1, n do
    local group = groups[i]
    if group then
      local failed, err, key, delta = addAll(group[1], 0, group[2], 0, #group[1])
      if failed then
        flags[i] = '2'
        refusals[#refusals + 1] = {i, key, delta, err}
      end
    end
  end
end
local fresh = {}
for i = 1, n do
  if flags[i] == '0' then fresh[#fresh + 1] = all[i] end
end
if #fresh > 0 then writeMarkers(current, currentSubs or openBucket(current, initialSubs, expiresAt), fresh, '1', expiresAt) end
local result = table.concat(flags)
local receipt = result
if #refusals > 0 then receipt = result .. ':' .. cjson.encode(refusals) end
redis.call('SET', KEYS[1], receipt, 'EX', markerTtl)
return {result, refusals, 0, nowS}
