#!lua
--[[
  Stream mode: applies a shard batch's counts and raises its watermarks, in
  one script, or applies nothing and says where the watermarks are. The key
  layout is in docs/architecture.md ("Redis keys"); why, in docs/streams.md.

  Input:
    KEYS[1]                the shard's watermarks, <prefix>wm:{<vshard>}: a
                           hash, one field per partition (its decimal number),
                           the highest offset of that partition applied here
    KEYS[2 .. m+1]         the batch's count keys
    ARGV[1]                the TTL a count key gets, seconds
    ARGV[2]                g, the number of partitions in the batch
    ARGV[3]                m, the number of count keys
    ARGV[4]                refresh: one character per count key, '1' when its
                           TTL is to be set even if it exists ('parts' sets
                           every written key's TTL)
    ARGV[5]                layout of the rest: 'sums' or 'parts'
    ARGV[6 .. 4g+5]        per partition: its number, the lowest and highest
                           offsets of its parts in the batch, and the
                           watermark expected ('-1': none); decimal strings
    'sums':  ARGV[4g+6 .. 4g+m+5]  per count key, the sum of its deltas over
                                   all parts (decimal)
    'parts': ARGV[4g+6 ..]         per part: its partition's position in the
                                   list above (1..g), k, then k pairs (count
                                   key index 1..m, delta as a decimal string)

  Output:
    {'applied', refusals}  every part applied and each partition's watermark
                           raised to its highest offset; refusals ('parts'
                           only, else empty): one {part index, count key,
                           delta, Redis error} per part Redis refused, which
                           counted nothing (the watermark still passes it:
                           its message is dead-lettered count-refused)
    {'found', w1 .. wg}    nothing written: some partition's watermark was
                           below the one expected (Redis lost writes) or at
                           or above its lowest offset (a replay, or a batch
                           straddling it); the watermarks found, decimal,
                           '-1' for none
    {'isolate'}            ('sums') Redis refused a sum; nothing written:
                           call again with 'parts'

  Errors:
    TALLY_SCRIPT_ARGS  the keys and arguments disagree; nothing was written
    TALLY_WATERMARK    a watermark field holds something else than an offset
                       (written by hand); nothing was written, and retrying
                       fails the same way until the field is repaired
    OOM                (the #!lua line) Redis is out of memory; nothing was
                       written
]]
if redis.replicate_commands then redis.replicate_commands() end
local countTtl = ARGV[1]
local g = tonumber(ARGV[2])
local m = tonumber(ARGV[3])
local refresh = ARGV[4]
local layout = ARGV[5]
if g == nil or m == nil or g < 1 or #KEYS ~= 1 + m then return redis.error_reply('TALLY_SCRIPT_ARGS keys and count key count disagree') end
if layout ~= 'sums' and layout ~= 'parts' then return redis.error_reply('TALLY_SCRIPT_ARGS unknown layout ' .. tostring(layout)) end

-- The watermarks of the batch's partitions, read at once.
local fields = {}
for p = 1, g do fields[p] = ARGV[6 + 4 * (p - 1)] end
local found = redis.call('HMGET', KEYS[1], unpack(fields))
local apply = true
for p = 1, g do
  local at = 6 + 4 * (p - 1)
  local lowest, expected = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 3])
  if lowest == nil or tonumber(ARGV[at + 2]) == nil or expected == nil then return redis.error_reply('TALLY_SCRIPT_ARGS partition ' .. p .. ' has no offsets') end
  local watermark = tonumber(found[p] or '-1')
  if watermark == nil then
    -- Redis's state, not the arguments: not data to dead-letter message by message, a stall to name (failure-class.ts: fatal).
    return redis.error_reply('TALLY_WATERMARK partition ' .. fields[p] .. "'s watermark in " .. KEYS[1] .. " is not an offset: '" ..
      string.sub(found[p], 1, 40) .. "'; set that field to the highest offset of the partition counted here")
  end
  -- Below what was seen: writes lost. At or above the lowest offset: some parts were applied before.
  if watermark < expected or watermark >= lowest then apply = false end
  found[p] = found[p] or '-1'
end
if not apply then
  local reply = {'found'}
  for p = 1, g do reply[p + 1] = found[p] end
  return reply
end

-- @include count_apply

local rest = 6 + 4 * g
local refusals = {}
if layout == 'sums' then
  local refused = addAll(KEYS, 1, ARGV, rest - 1, m, nil, refresh)
  if refused then return {'isolate'} end
else
  -- Part by part, each all or nothing: a refused part counts nothing, the others count.
  local at, part = rest, 0
  while at <= #ARGV do
    part = part + 1
    local k = tonumber(ARGV[at + 1])
    if tonumber(ARGV[at]) == nil or k == nil then return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. part .. ' has no partition or no change count') end
    local keys, deltas = {}, {}
    for c = 1, k do
      local index = tonumber(ARGV[at + 2 * c])
      if index == nil or index < 1 or index > m then return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. part .. ' names count key ' .. tostring(ARGV[at + 2 * c])) end
      keys[c] = KEYS[1 + index]
      deltas[c] = ARGV[at + 2 * c + 1]
    end
    local position, err, key, delta = addAll(keys, 0, deltas, 0, k, nil, nil)
    if position then refusals[#refusals + 1] = {part, key, delta, err} end
    at = at + 2 + 2 * k
  end
end

-- Raised to the batch's highest offset of each partition: every part at or below it is applied (or refused, and dead-lettered).
local raised = {}
for p = 1, g do
  local at = 6 + 4 * (p - 1)
  raised[#raised + 1] = ARGV[at]
  raised[#raised + 1] = ARGV[at + 2]
end
redis.call('HSET', KEYS[1], unpack(raised))
return {'applied', refusals}
