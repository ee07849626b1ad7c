#!lua
--[[
  Two-step mode, step 1: finds which parts of a shard batch are new and
  claims them for this daemon. The key layout is in docs/architecture.md
  ("Redis keys"); how the script works, in its "The scripts" section.

  Input:
    KEYS[1]     the shard's marker base, <prefix>mk:{<vshard>}
    ARGV[1]     bucket width, seconds
    ARGV[2]     marker TTL, seconds
    ARGV[3]     sub-buckets of a bucket whose bucket before is unknown (a
                power of two)
    ARGV[4]     filter bits per expected marker of a bucket this script
                opens (0: no filter)
    ARGV[5]     this daemon's claim token (hex)
    ARGV[6]     claim TTL, milliseconds
    ARGV[7]     the buckets the worker probed itself, from its copies of
                settled buckets' filters: '' or 'bucket:blocks:markers'
                joined by ','; a bucket whose block count or marker count
                (meta `n`, -1 when absent) is not the copy's is probed here
                instead
    ARGV[8]     per bucket of ARGV[7] in its order, one character per part,
                '1' where that filter may hold the part's digest
    ARGV[9]     fenced adoption (bench/results/notes/cluster-floor.md):
                this batch's id, or '' for none. With an id, the claim
                record holds it, and a part claimed over an expired claim
                of another daemon, or over a claim of this daemon's under
                another id, is adopted: its chain (the ids of the batches
                whose claims on it were taken over, oldest first) is
                returned, and kept in the bucket's meta under
                `a<batch>:<digest>` for the next adopter; a claim of this
                batch's own id (a rerun) hands on its chain as it is
    ARGV[10 ..] one 16-byte digest per part

  Output:
    {flags, bucket, takeovers, batch, now, chains}
      flags      one character per part: '0' new (now claimed by this
                 daemon), '1' done (a duplicate: its marker is occupied, or
                 an earlier part of this batch has the same digest), '2' held
                 (another daemon's live claim: leave it for later)
      bucket     the bucket the claims went to, for occupy_markers
      takeovers  parts claimed over another daemon's expired claim
      batch      this batch's number in that bucket (0 when nothing was
                 claimed), for occupy_markers
      now        the server's time, seconds: which buckets have settled
      chains     per part claimed with a chain (ARGV[9] only): its index
                 (1-based, in ARGV order), then its chain, ids joined by
                 ' '; empty without ARGV[9]

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
local mine = 'c' .. ARGV[5] .. ':'
local claimTtl = tonumber(ARGV[6])
local batchId = ARGV[9] or ''
local FIRST = 10
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

-- What a marker value says: 'done', 'held' (another daemon's live claim), 'expired' (another daemon's claim that ran
-- out), 'adopt' (with fenced adoption: this daemon's claim under another batch id, which ended or died) or 'free'
-- (no claim that counts, or this batch's own); and the id of the batch that claimed it, when its record names one.
local batchStates, batchIds = {}, {}
local function stateOf(bucket, value)
  if value == '1' then return 'done' end
  local cacheKey = bucket .. ':' .. value
  local state = batchStates[cacheKey]
  if state == nil then
    local record = redis.call('HGET', metaKey(bucket), 'b' .. value)
    local id = batchId ~= '' and record and string.match(record, '^c[^:]*:([^:]+):%d+$')
    if record == '1' then
      state = 'done'
    elseif record and string.sub(record, 1, #mine) ~= mine then
      local at = tonumber(string.match(record, ':(%d+)$'))
      state = (at ~= nil and at + claimTtl > nowMs) and 'held' or 'expired'
    elseif id and batchId ~= '' and id ~= batchId then
      state = 'adopt'
    else
      state = 'free'
    end
    batchStates[cacheKey] = state
    batchIds[cacheKey] = id or false
  end
  return state
end

-- The buckets the worker probed itself: by bucket, its block count and the distinct digests its copy may hold.
local parts = {}
for i = FIRST, #ARGV do parts[#parts + 1] = ARGV[i] end
local vouched = vouchedBuckets(ARGV[7], ARGV[8], parts)

-- Every live bucket that holds markers, newest first: done wins; a live claim of another daemon holds.
local expired = {}
-- With fenced adoption, the newest claim on each digest: where its chain is kept, and whether it is to be adopted.
local claimedBy = {}
local currentSubs = readBuckets(current, oldest, distinct, function(bucket, digest, value)
  local state = stateOf(bucket, value)
  if state == 'done' then
    seen[digest] = '1'
  elseif state == 'held' then
    if seen[digest] == '0' then seen[digest] = '2' end
  elseif state == 'expired' then
    expired[digest] = true
  end
  if batchId ~= '' and state ~= 'done' and state ~= 'held' and not claimedBy[digest] then
    claimedBy[digest] = {bucket = bucket, batch = value, id = batchIds[bucket .. ':' .. value], adopt = state ~= 'free'}
  end
end, vouched)

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
  redis.call('HSET', meta, 'b' .. batch, mine .. (batchId ~= '' and batchId .. ':' or '') .. nowMs)
  writeMarkers(current, subs, fresh, tostring(batch), expiresAt)
end

for i = FIRST, #ARGV do
  if flags[i - FIRST + 1] == nil then flags[i - FIRST + 1] = seen[ARGV[i]] end
end

-- Each adopted part's chain: the one kept with the claim taken over, and that claim's id after it when it is
-- adopted. Only with a batch id: nothing of it runs on an older format's claims.
local chains = {}
if next(claimedBy) then
  local chainOf = {}
  for _, digest in ipairs(fresh) do
    local from = claimedBy[digest]
    if from then
      local chain = redis.call('HGET', metaKey(from.bucket), 'a' .. from.batch .. ':' .. digest)
      if from.adopt and from.id then chain = chain and (chain .. ' ' .. from.id) or from.id end
      if chain then
        chainOf[digest] = chain
        redis.call('HSET', metaKey(current), 'a' .. batch .. ':' .. digest, chain)
      end
    end
  end
  for i = FIRST, #ARGV do
    local chain = flags[i - FIRST + 1] == '0' and chainOf[ARGV[i]]
    if chain then
      chains[#chains + 1] = i - FIRST + 1
      chains[#chains + 1] = chain
      chainOf[ARGV[i]] = nil
    end
  end
end
return {table.concat(flags), current, takeovers, batch, nowS, chains}
