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
local t = redis.call('TIME')
local nowS = tonumber(t[1])
local nowMs = nowS * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = math.floor(nowS / width)
local oldest = math.floor((nowS - ttl) / width)
local expiresAt = (current + 1) * width + ttl

-- Sub-bucket count per live bucket (false: the bucket holds no marker).
local subsOf = {}
for bucket = current, oldest, -1 do
  subsOf[bucket] = tonumber(redis.call('HGET', base .. ':' .. bucket .. ':m', 's')) or false
end
local function openCurrent()
  if subsOf[current] then return subsOf[current] end
  local before = tonumber(redis.call('HGET', base .. ':' .. (current - 1) .. ':m', 'n'))
  local subs = initialSubs
  if before then
    subs = 1
    while subs < 65536 and subs * 64 < before do subs = subs * 2 end
  end
  local meta = base .. ':' .. current .. ':m'
  redis.call('HSET', meta, 's', subs)
  redis.call('EXPIREAT', meta, expiresAt)
  subsOf[current] = subs
  return subs
end
local function keyOf(bucket, subs, digest)
  return base .. ':' .. bucket .. ':' .. ((string.byte(digest, 1) * 256 + string.byte(digest, 2)) % subs)
end

local claim = mine .. nowMs
local flags = {}
local seen = {}
local touched = {}
local takeovers = 0
local claimed = 0
for i = 6, #ARGV do
  local digest = ARGV[i]
  local flag = '0'
  if seen[digest] then
    flag = '1'
  else
    seen[digest] = true
    local expired = false
    for bucket = current, oldest, -1 do
      local subs = subsOf[bucket]
      if subs then
        local value = redis.call('HGET', keyOf(bucket, subs, digest), digest)
        if value then
          if value == '1' then
            flag = '1'
            break
          end
          if flag == '0' and string.sub(value, 1, #mine) ~= mine then
            local at = tonumber(string.match(value, ':(%d+)$'))
            if at ~= nil and at + claimTtl > nowMs then flag = '2' else expired = true end
          end
        end
      end
    end
    if flag == '0' then
      if expired then takeovers = takeovers + 1 end
      local key = keyOf(current, openCurrent(), digest)
      redis.call('HSET', key, digest, claim)
      touched[key] = true
      claimed = claimed + 1
    end
  end
  flags[#flags + 1] = flag
end
for key in pairs(touched) do redis.call('EXPIREAT', key, expiresAt) end
if claimed > 0 then redis.call('HINCRBY', base .. ':' .. current .. ':m', 'n', claimed) end
return {table.concat(flags), current, takeovers}
