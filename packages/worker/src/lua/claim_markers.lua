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
    ARGV[4]     this daemon's claim token (hex)
    ARGV[5]     claim TTL, milliseconds
    ARGV[6 ..]  one 16-byte digest per part

  Output:
    {flags, bucket, takeovers}
      flags      one character per part: '0' new (now claimed by this
                 daemon), '1' done (a duplicate: its marker is occupied, or
                 an earlier part of this batch has the same digest), '2' held
                 (another daemon's live claim: leave it for later)
      bucket     the bucket the claims went to, for occupy_markers
      takeovers  parts claimed over another daemon's expired claim (that
                 daemon died or stalled: if it had written the counts, the
                 part is counted again, as after a crash in the window)

  - Every live bucket is read, newest first: a done marker anywhere wins.
  - Each bucket of a shard has a meta hash <base>:<bucket>:m: `s`, its
    sub-bucket count, fixed by the first script that writes to the bucket
    (from `n` of the bucket before: about 64 markers per hash, so each stays
    a listpack), and `n`, the markers written to it. A bucket without meta
    holds no marker and is not read.
  - A claim is 'c<token>:<ms>'. One of this daemon's (a retry of this
    batch after a lost reply) or one older than the claim TTL (its daemon
    died or stalled) is taken over; a live one of another daemon holds the
    part back, so two daemons never count one message at the same instant.
  - Each hash written gets its expiry once per call: the bucket's end plus
    the marker TTL, so a marker lives at least the marker TTL.
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
local mine = 'c' .. ARGV[4] .. ':'
local claimTtl = tonumber(ARGV[5])
local FIRST = 6
local CHUNK = 1000
local t = redis.call('TIME')
local nowS = tonumber(t[1])
local nowMs = nowS * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = math.floor(nowS / width)
local oldest = math.floor((nowS - ttl) / width)
local expiresAt = (current + 1) * width + ttl

-- Groups digests by the hash they fall in: {key -> {digests}}, keys in first-seen order.
local function groupBy(subs, bucket, digests)
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

-- Every live bucket that holds markers, newest first: done wins; a live claim of another daemon holds.
local expired = {}
local currentSubs = false
for bucket = current, oldest, -1 do
  local subs = tonumber(redis.call('HGET', base .. ':' .. bucket .. ':m', 's'))
  if bucket == current then currentSubs = subs or false end
  if subs then
    local order, groups = groupBy(subs, bucket, distinct)
    for _, key in ipairs(order) do
      local group = groups[key]
      for from = 1, #group, CHUNK do
        local to = math.min(from + CHUNK - 1, #group)
        local values = redis.call('HMGET', key, unpack(group, from, to))
        for j = from, to do
          local value = values[j - from + 1]
          if value then
            local digest = group[j]
            if value == '1' then
              seen[digest] = '1'
            elseif seen[digest] == '0' and string.sub(value, 1, #mine) ~= mine then
              local at = tonumber(string.match(value, ':(%d+)$'))
              if at ~= nil and at + claimTtl > nowMs then seen[digest] = '2' else expired[digest] = true end
            end
          end
        end
      end
    end
  end
end

-- Claim the new ones in the bucket of now, opening it if this is its first write.
local fresh = {}
local takeovers = 0
for _, digest in ipairs(distinct) do
  if seen[digest] == '0' then
    fresh[#fresh + 1] = digest
    if expired[digest] then takeovers = takeovers + 1 end
  end
end
if #fresh > 0 then
  local meta = base .. ':' .. current .. ':m'
  if not currentSubs then
    local before = tonumber(redis.call('HGET', base .. ':' .. (current - 1) .. ':m', 'n'))
    currentSubs = initialSubs
    if before then
      currentSubs = 1
      while currentSubs < 65536 and currentSubs * 64 < before do currentSubs = currentSubs * 2 end
    end
    redis.call('HSET', meta, 's', currentSubs)
    redis.call('EXPIREAT', meta, expiresAt)
  end
  local claim = mine .. nowMs
  local order, groups = groupBy(currentSubs, current, fresh)
  for _, key in ipairs(order) do
    local group = groups[key]
    for from = 1, #group, CHUNK do
      local args = {}
      for j = from, math.min(from + CHUNK - 1, #group) do
        args[#args + 1] = group[j]
        args[#args + 1] = claim
      end
      redis.call('HSET', key, unpack(args))
    end
    redis.call('EXPIREAT', key, expiresAt)
  end
  redis.call('HINCRBY', meta, 'n', #fresh)
end

for i = FIRST, #ARGV do
  if flags[i - FIRST + 1] == nil then flags[i - FIRST + 1] = seen[ARGV[i]] end
end
return {table.concat(flags), current, takeovers}
