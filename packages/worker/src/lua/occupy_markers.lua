#!lua
--[[
  Two-step mode, step 3: occupies the markers of a batch's new parts, after
  their counts were written (invariant 2): each claim becomes done.

  Input:
    KEYS[1]     the shard's marker base, <prefix>mk:{<vshard>}
    ARGV[1]     bucket width, seconds
    ARGV[2]     marker TTL, seconds
    ARGV[3]     sub-buckets of a new bucket when the bucket before it is
                unknown (as in claim_markers)
    ARGV[4]     the bucket claim_markers put the claims in
    ARGV[5 ..]  the 16-byte digests of the parts to occupy

  Output:
    n, the number of markers set

  The done marker replaces the claim in the claim's bucket while that is
  still the bucket of now (server clock). When time has moved on, it goes to
  the bucket of now, so it lives at least the marker TTL from now, and the
  claim is deleted from its old bucket. HSET and HDEL are idempotent: a retry
  simply does it again. Writes are grouped by hash (one HSET per hash, in
  chunks of 1,000 fields), as in claim_markers.lua.
]]
if redis.replicate_commands then redis.replicate_commands() end
local base = KEYS[1]
local width = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local initialSubs = tonumber(ARGV[3])
local claimed = tonumber(ARGV[4])
local FIRST = 5
local CHUNK = 1000
local nowS = tonumber(redis.call('TIME')[1])
local current = math.floor(nowS / width)

local digests = {}
for i = FIRST, #ARGV do digests[#digests + 1] = ARGV[i] end

local function groupBy(subs, bucket)
  local order, groups = {}, {}
  local prefix = base .. ':' .. bucket .. ':'
  for _, digest in ipairs(digests) do
    local key = prefix .. ((string.byte(digest, 1) * 256 + string.byte(digest, 2)) % subs)
    local group = groups[key]
    if group == nil then
      group = {}
      groups[key] = group
      order[#order + 1] = key
    end
    group[#group + 1] = digest
  end
  return order, groups
end

-- Runs `command key field [value] ...` per hash, in chunks.
local function perHash(command, order, groups, value)
  for _, key in ipairs(order) do
    local group = groups[key]
    for from = 1, #group, CHUNK do
      local args = {}
      for j = from, math.min(from + CHUNK - 1, #group) do
        args[#args + 1] = group[j]
        if value then args[#args + 1] = value end
      end
      redis.call(command, key, unpack(args))
    end
  end
end

local claimSubs = tonumber(redis.call('HGET', base .. ':' .. claimed .. ':m', 's')) or initialSubs
if current == claimed then
  local order, groups = groupBy(claimSubs, current)
  perHash('HSET', order, groups, '1')
  return #digests
end

-- A later bucket: open it as claim_markers would, then move each marker there.
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
local order, groups = groupBy(subs, current)
perHash('HSET', order, groups, '1')
for _, key in ipairs(order) do redis.call('EXPIREAT', key, expiresAt) end
local oldOrder, oldGroups = groupBy(claimSubs, claimed)
perHash('HDEL', oldOrder, oldGroups, nil)
redis.call('HINCRBY', meta, 'n', #digests)
return #digests
