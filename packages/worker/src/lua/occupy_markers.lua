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
  simply does it again.
]]
if redis.replicate_commands then redis.replicate_commands() end
local base = KEYS[1]
local width = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local initialSubs = tonumber(ARGV[3])
local claimed = tonumber(ARGV[4])
local nowS = tonumber(redis.call('TIME')[1])
local current = math.floor(nowS / width)
local function keyOf(bucket, subs, digest)
  return base .. ':' .. bucket .. ':' .. ((string.byte(digest, 1) * 256 + string.byte(digest, 2)) % subs)
end
local claimSubs = tonumber(redis.call('HGET', base .. ':' .. claimed .. ':m', 's')) or initialSubs
if current == claimed then
  for i = 5, #ARGV do redis.call('HSET', keyOf(current, claimSubs, ARGV[i]), ARGV[i], '1') end
  return #ARGV - 4
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
local touched = {}
for i = 5, #ARGV do
  local digest = ARGV[i]
  local key = keyOf(current, subs, digest)
  redis.call('HSET', key, digest, '1')
  redis.call('HDEL', keyOf(claimed, claimSubs, digest), digest)
  touched[key] = true
end
for key in pairs(touched) do redis.call('EXPIREAT', key, expiresAt) end
redis.call('HINCRBY', meta, 'n', #ARGV - 4)
return #ARGV - 4
