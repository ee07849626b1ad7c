#!lua
--[[
  Two-step mode, step 1: the pre-check. Finds which parts of a shard batch
  are new and claims them for this daemon, in one step no other daemon can
  interleave with.

  Input:
    KEYS[1]     the shard's marker base, <prefix>mk:{<vshard>}; the script
                reads and writes <base>:<bucket>:<sub> and <base>:<bucket>:m
                (the same hash tag, so the same slot on a cluster)
    ARGV[1]     bucket width, seconds
    ARGV[2]     marker TTL, seconds
    ARGV[3]     sub-buckets of a shard's bucket when the bucket before it is
                unknown (a power of two)
    ARGV[4]     filter bits per expected marker of a bucket this script
                opens (0: no filter; marker_buckets.lua)
    ARGV[5]     this daemon's claim token (hex)
    ARGV[6]     claim TTL, milliseconds
    ARGV[7 ..]  one 16-byte digest per part

  Output:
    {flags, bucket, takeovers, batch}
      flags      one character per part: '0' new (now claimed by this
                 daemon), '1' done (a duplicate: its marker is occupied, or
                 an earlier part of this batch has the same digest), '2' held
                 (another daemon's live claim: leave it for later)
      bucket     the bucket the claims went to, for occupy_markers
      batch      this batch's number in that bucket (0 when nothing was
                 claimed), for occupy_markers
      takeovers  parts claimed over another daemon's expired claim (that
                 daemon died or stalled: if it had written the counts, the
                 part is counted again, as after a crash in the window)

  - Every live bucket is read, newest first: a done marker anywhere wins.
  - Each bucket of a shard has a meta hash <base>:<bucket>:m: `s`, its
    sub-bucket count, fixed by the first script that writes to the bucket
    (from `n` of the bucket before: about 64 markers per hash, so each stays
    a listpack), `n`, the markers written to it, `b`, the last batch number
    given out, and one field `b<number>` per two-step batch: 'c<token>:<ms>'
    while the batch is claimed, '1' once it is done. A bucket without meta
    holds no marker and is not read.
  - A marker's value is '1' (done: atomic mode, or moved by occupy_markers)
    or the number (>= 2) of the two-step batch that claimed it: the part is
    done when that batch is. So occupying a whole batch is one HSET of its
    `b<number>` field, not one write per part.
  - A claim of this daemon's (a retry of this batch after a lost reply) or
    one older than the claim TTL (its daemon died or stalled) is taken over;
    a live one of another daemon holds the part back, so two daemons never
    count one message at the same instant.
  - Each hash gets its expiry when it is created: the bucket's end plus the
    marker TTL, so a marker lives at least the marker TTL. The meta field
    `x` (a bitmap by sub-bucket) says which already have it.
  - Reads and writes are grouped by hash: one HMGET per hash and bucket,
    one HSET per hash, in chunks of 1,000 fields (unpack's limit is the Lua
    C stack). A call costs far more than a field, and a batch of 500 parts
    touches a few hundred hashes at most.
  - TIME is the server's clock, so daemons on several machines agree on the
    bucket; replicate_commands lets a script that read TIME write on
    Redis 5 and 6 (a no-op from 7).
]]
if redis.replicate_commands then redis.replicate_commands() end
local base = KEYS[1]
local width = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local initialSubs = tonumber(ARGV[3])
local filterBits = tonumber(ARGV[4])
if filterBits == nil then return redis.error_reply('TALLY_SCRIPT_ARGS no filter bits argument') end
local mine = 'c' .. ARGV[5] .. ':'
local claimTtl = tonumber(ARGV[6])
local FIRST = 7
local t = redis.call('TIME')
local nowS = tonumber(t[1])
local nowMs = nowS * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = math.floor(nowS / width)
local oldest = math.floor((nowS - ttl) / width)
local expiresAt = (current + 1) * width + ttl

-- @include marker_buckets

-- The distinct digests of the batch; a repeat within the batch is a duplicate of its first copy.
local flags = {}
local seen = {}
local distinct = {}
for i = FIRST, #ARGV do
  local digest = ARGV[i]
  if seen[digest] then
    flags[i - FIRST + 1] = '1'
  else
    seen[digest] = '0'
    distinct[#distinct + 1] = digest
  end
end

-- What a marker value says: 'done', 'held' (another daemon's live claim) or 'free' (no claim that counts).
local batchStates = {}
local function stateOf(bucket, value)
  if value == '1' then return 'done' end
  local cacheKey = bucket .. ':' .. value
  local state = batchStates[cacheKey]
  if state == nil then
    local record = redis.call('HGET', metaKey(bucket), 'b' .. value)
    if record == '1' then
      state = 'done'
    elseif record and string.sub(record, 1, #mine) ~= mine then
      local at = tonumber(string.match(record, ':(%d+)$'))
      state = (at ~= nil and at + claimTtl > nowMs) and 'held' or 'expired'
    else
      state = 'free'
    end
    batchStates[cacheKey] = state
  end
  return state
end

-- Every live bucket that holds markers, newest first: done wins; a live claim of another daemon holds.
local expired = {}
local currentSubs = readBuckets(current, oldest, distinct, function(bucket, digest, value)
  local state = stateOf(bucket, value)
  if state == 'done' then
    seen[digest] = '1'
  elseif state == 'held' then
    if seen[digest] == '0' then seen[digest] = '2' end
  elseif state == 'expired' then
    expired[digest] = true
  end
end)

-- Claim the new ones for a new batch number in the bucket of now, opening the bucket if this is its first write.
local fresh = {}
local takeovers = 0
for _, digest in ipairs(distinct) do
  if seen[digest] == '0' then
    fresh[#fresh + 1] = digest
    if expired[digest] then takeovers = takeovers + 1 end
  end
end
local batch = 0
if #fresh > 0 then
  local subs = currentSubs or openBucket(current, initialSubs, expiresAt)
  local meta = metaKey(current)
  batch = redis.call('HINCRBY', meta, 'b', 1) + 1
  redis.call('HSET', meta, 'b' .. batch, mine .. nowMs)
  writeMarkers(current, subs, fresh, tostring(batch), expiresAt)
end

for i = FIRST, #ARGV do
  if flags[i - FIRST + 1] == nil then flags[i - FIRST + 1] = seen[ARGV[i]] end
end
return {table.concat(flags), current, takeovers, batch}
