#!lua
--[[
  Two-step mode, step 3: occupies the markers of a batch's new parts, after
  their counts were written (invariant 2): each claim becomes done.

  Input:
    KEYS[1]     the shard's marker base, <prefix>mk:{<vshard>}
    ARGV[1]     bucket width, seconds
    ARGV[2]     marker TTL, seconds
    ARGV[3]     sub-buckets per bucket (a power of two)
    ARGV[4]     the bucket claim_markers put the claims in
    ARGV[5 ..]  the 16-byte digests of the parts to occupy

  Output:
    n, the number of markers set

  The done marker goes to the bucket of now (server clock), so it lives at
  least the marker TTL from now. When that is a later bucket than the
  claim's, the claim is deleted from its own bucket. HSET and HDEL are
  idempotent: a retry simply does it again.
]]
if redis.replicate_commands then redis.replicate_commands() end
local base = KEYS[1]
local width = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local subs = tonumber(ARGV[3])
local claimed = tonumber(ARGV[4])
local nowS = tonumber(redis.call('TIME')[1])
local current = math.floor(nowS / width)
local touched = {}
for i = 5, #ARGV do
  local digest = ARGV[i]
  local sub = ':' .. ((string.byte(digest, 1) * 256 + string.byte(digest, 2)) % subs)
  local key = base .. ':' .. current .. sub
  redis.call('HSET', key, digest, '1')
  if current ~= claimed then
    redis.call('HDEL', base .. ':' .. claimed .. sub, digest)
    touched[key] = true
  end
end
-- The claim's hash already has this bucket's expiry; a later bucket's hash may be new.
local expiresAt = (current + 1) * width + ttl
for key in pairs(touched) do redis.call('EXPIREAT', key, expiresAt) end
return #ARGV - 4
