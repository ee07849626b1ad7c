#!lua
--[[
  Two-step mode, step 3: occupies the markers of a batch's new parts, after
  their counts were written (invariant 2).

  Input:
    KEYS[1]     the shard's marker base, <prefix>mk:{<vshard>}
    ARGV[1]     bucket width, seconds
    ARGV[2]     marker TTL, seconds
    ARGV[3]     sub-buckets of a new bucket when the bucket before it is
                unknown (as in claim_markers)
    ARGV[4]     the bucket claim_markers put the claims in
    ARGV[5]     the batch number claim_markers gave them
    ARGV[6]     r, the number of parts Redis refused to count
    ARGV[7 .. 6+r]  their 16-byte digests: their claims are deleted, so they
                get no marker and their replay counts them
    ARGV[7+r ..]    the 16-byte digests of the other new parts: only needed,
                and only sent, when the first call answered -1

  Output:
    n  the markers occupied, or -1: time has moved on to a later bucket, so
       call again with the digests

  The batch's parts hold its number; its record `b<number>` in the bucket's
  meta hash turns from the claim into '1', and every part reads as done: one
  HSET for the whole batch. When the bucket of now is a later one than the
  claims', the claims' hashes expire earlier than the marker TTL from now,
  so the markers are also written as '1' to the bucket of now (in chunks of
  1,000 fields per HSET), which lives at least the TTL from now. Every write
  is idempotent: a retry does it again.
]]
if redis.replicate_commands then redis.replicate_commands() end
local base = KEYS[1]
local width = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local initialSubs = tonumber(ARGV[3])
local claimed = tonumber(ARGV[4])
local batch = ARGV[5]
local refused = tonumber(ARGV[6])
local FIRST = 7 + refused
local CHUNK = 1000
local nowS = tonumber(redis.call('TIME')[1])
local current = math.floor(nowS / width)
if current ~= claimed and #ARGV < FIRST then return -1 end

local claimSubs = tonumber(redis.call('HGET', base .. ':' .. claimed .. ':m', 's')) or initialSubs
for i = 7, 6 + refused do
  local digest = ARGV[i]
  redis.call('HDEL', base .. ':' .. claimed .. ':' .. ((string.byte(digest, 1) * 256 + string.byte(digest, 2)) % claimSubs), digest)
end
redis.call('HSET', base .. ':' .. claimed .. ':m', 'b' .. batch, '1')
if current == claimed then return 0 end

-- A later bucket: open it as claim_markers would, then write the markers there as done.
local expiresAt = (current + 1) * width + ttl
local meta = base .. ':' .. current .. ':m'
local subs = tonumber(redis.call('HGET', meta, 's'))
if not subs then
  local before = tonumber(redis.call('HGET', base .. ':' .. (current - 1) .. ':m', 'n'))
  subs = initialSubs
  if before then
    subs = 1
    while subs < 65536 and subs * 64 < before do subs = subs * 2 end
  end
  redis.call('HSET', meta, 's', subs)
  redis.call('EXPIREAT', meta, expiresAt)
end
-- Which of the bucket's hashes already carry their expiry: a bitmap by
-- sub-bucket in the meta field `x`, so a batch sets EXPIREAT only on the
-- hashes it creates instead of on every hash it touches (one call per hash
-- per batch otherwise).
local function expiring(meta)
  local bitmap = redis.call('HGET', meta, 'x') or ''
  local added = {}
  local api = {}
  function api.ensure(sub, key, expiresAt)
    local index = math.floor(sub / 8) + 1
    local bit = 2 ^ (sub % 8)
    local byte = added[index] or string.byte(bitmap, index) or 0
    if math.floor(byte / bit) % 2 == 1 then return end
    redis.call('EXPIREAT', key, expiresAt)
    added[index] = byte + bit
  end
  function api.save()
    if next(added) == nil then return end
    local bytes = {}
    local length = #bitmap
    for index in pairs(added) do if index > length then length = index end end
    for index = 1, length do bytes[index] = added[index] or string.byte(bitmap, index) or 0 end
    local parts = {}
    for from = 1, length, 4000 do parts[#parts + 1] = string.char(unpack(bytes, from, math.min(from + 3999, length))) end
    redis.call('HSET', meta, 'x', table.concat(parts))
  end
  return api
end

local order, groups, keyOfSub, subOfKey = {}, {}, {}, {}
local prefix = base .. ':' .. current .. ':'
for i = FIRST, #ARGV do
  local digest = ARGV[i]
  local sub = (string.byte(digest, 1) * 256 + string.byte(digest, 2)) % subs
  local key = keyOfSub[sub]
  if key == nil then
    key = prefix .. sub
    keyOfSub[sub] = key
    subOfKey[key] = sub
  end
  local group = groups[key]
  if group == nil then
    group = {}
    groups[key] = group
    order[#order + 1] = key
  end
  group[#group + 1] = digest
end
local expiry = expiring(meta)
for _, key in ipairs(order) do
  local group = groups[key]
  for from = 1, #group, CHUNK do
    local args = {}
    for j = from, math.min(from + CHUNK - 1, #group) do
      args[#args + 1] = group[j]
      args[#args + 1] = '1'
    end
    redis.call('HSET', key, unpack(args))
  end
  expiry.ensure(subOfKey[key], key, expiresAt)
end
expiry.save()
redis.call('HINCRBY', meta, 'n', #ARGV - FIRST + 1)
return #ARGV - FIRST + 1
