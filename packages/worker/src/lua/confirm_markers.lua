#!lua
--[[
  Before a batch's WAIT (replica-wait.ts): checks that every marker the
  batch relies on is done on this master, then writes a touch for the WAIT
  to follow. The key layout is in docs/architecture.md ("Redis keys"); why
  every marker is checked, in its "The scripts" section.

  Input:
    KEYS[1]     the shard's marker base, <prefix>mk:{<vshard>}
    ARGV[1]     bucket width, seconds
    ARGV[2]     marker TTL, seconds
    ARGV[3]     sub-buckets of a bucket whose bucket before is unknown (as
                in claim_markers)
    ARGV[4]     filter bits per expected marker of a bucket it opens (as in
                claim_markers)
    ARGV[5 ..]  the 16-byte digests of the parts the batch relies on: those
                it counted and marked, and those it found done (duplicates)

  Output:
    the number of those digests not done in any live bucket (0: all done,
    and the touch written; otherwise nothing written: rerun the batch)

  Errors:
    TALLY_SCRIPT_ARGS  no filter bits argument; nothing was written
    OOM                (the #!lua line) Redis is out of memory; nothing was
                       written
]]
if redis.replicate_commands then redis.replicate_commands() end
local base = KEYS[1]
local width = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local initialSubs = tonumber(ARGV[3])
local filterBits = tonumber(ARGV[4])
if filterBits == nil then return redis.error_reply('TALLY_SCRIPT_ARGS no filter bits argument') end
local nowS = tonumber(redis.call('TIME')[1])
local current = math.floor(nowS / width)
local oldest = math.floor((nowS - ttl) / width)

-- @include marker_buckets

local digests = {}
for i = 5, #ARGV do digests[#digests + 1] = ARGV[i] end

-- A two-step marker holds its batch's number: done once that batch's record is '1'.
local batchDone = {}
local function isDone(bucket, value)
  if value == '1' then return true end
  local cacheKey = bucket .. ':' .. value
  if batchDone[cacheKey] == nil then batchDone[cacheKey] = redis.call('HGET', metaKey(bucket), 'b' .. value) == '1' end
  return batchDone[cacheKey]
end

-- The newest bucket each digest is done in (buckets are visited newest first).
local doneIn = {}
readBuckets(current, oldest, digests, function(bucket, digest, value)
  if doneIn[digest] == nil and isDone(bucket, value) then doneIn[digest] = bucket end
end)

local missing = 0
local newest = oldest
local renew = {}
for _, digest in ipairs(digests) do
  local bucket = doneIn[digest]
  if bucket == nil then
    missing = missing + 1
  else
    if bucket > newest then newest = bucket end
    if (bucket + 1) * width + ttl - nowS < ttl / 2 then renew[#renew + 1] = digest end
  end
end
if missing > 0 then return missing end

if #renew > 0 then
  local expiresAt = (current + 1) * width + ttl
  writeMarkers(current, openBucket(current, initialSubs, expiresAt), renew, '1', expiresAt)
else
  redis.call('EXPIREAT', metaKey(newest), (newest + 1) * width + ttl)
end
return 0
