-- Marker buckets (the format is shared/src/markers.ts): the helpers every
-- marker script needs, pasted in by the loader at `-- @include
-- marker_buckets` (Redis scripts cannot call each other). Each script sets
-- `base`, its shard's marker base <prefix>mk:{<vshard>}, before using them.
--
--   <base>:<bucket>:<sub>  hash: field 16-byte digest, value '1' (done) or
--                          the number of the two-step batch that claimed it
--   <base>:<bucket>:m      meta: s sub-buckets, n markers written, x which
--                          hashes carry their expiry, b last batch number,
--                          b<number> a two-step batch's claim or '1' (done)

-- Fields per HMGET/HSET: unpack's limit is the Lua C stack.
local CHUNK = 1000

local function metaKey(bucket)
  return base .. ':' .. bucket .. ':m'
end

-- The sub-bucket a digest falls in: its first two bytes, big-endian, modulo
-- the bucket's sub-bucket count (shared/src/markers.ts subBucketOf).
local function subOf(digest, subs)
  return (string.byte(digest, 1) * 256 + string.byte(digest, 2)) % subs
end

-- Groups digests by the hash they fall in: {key -> {digests}}, keys in
-- first-seen order. Key strings are made once per sub-bucket (number
-- formatting is what costs).
local function groupBy(subs, bucket, digests)
  local order, groups, keyOfSub, subOfKey = {}, {}, {}, {}
  local prefix = base .. ':' .. bucket .. ':'
  for _, digest in ipairs(digests) do
    local sub = subOf(digest, subs)
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
  return order, groups, subOfKey
end

-- Calls visit(bucket, digest, value) for every digest present in a live
-- bucket (now back to `oldest`), newest first: one HMGET per hash and
-- bucket. A bucket without a meta hash holds no marker and is not read.
-- Returns the sub-bucket count of `current` (false when it has none yet).
local function readBuckets(current, oldest, digests, visit)
  local currentSubs = false
  for bucket = current, oldest, -1 do
    local subs = tonumber(redis.call('HGET', metaKey(bucket), 's'))
    if bucket == current then currentSubs = subs or false end
    if subs then
      local order, groups = groupBy(subs, bucket, digests)
      for _, key in ipairs(order) do
        local group = groups[key]
        for from = 1, #group, CHUNK do
          local to = math.min(from + CHUNK - 1, #group)
          local values = redis.call('HMGET', key, unpack(group, from, to))
          for j = from, to do
            local value = values[j - from + 1]
            if value then visit(bucket, group[j], value) end
          end
        end
      end
    end
  end
  return currentSubs
end

-- The sub-bucket count of `bucket`, opening it (its meta hash, with the
-- bucket's expiry) if this is its first write: enough hashes for the markers
-- the bucket before received at 64 each (half the listpack limit, so a rate
-- that doubles within a bucket still fits), or `initialSubs` when that one
-- is unknown.
local function openBucket(bucket, initialSubs, expiresAt)
  local meta = metaKey(bucket)
  local subs = tonumber(redis.call('HGET', meta, 's'))
  if subs then return subs end
  local before = tonumber(redis.call('HGET', metaKey(bucket - 1), 'n'))
  subs = initialSubs
  if before then
    subs = 1
    while subs < 65536 and subs * 64 < before do subs = subs * 2 end
  end
  redis.call('HSET', meta, 's', subs)
  redis.call('EXPIREAT', meta, expiresAt)
  return subs
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

-- Writes `value` for each digest into `bucket` (already open, `subs`
-- sub-buckets): one HSET per hash, in chunks; each hash created here gets
-- the bucket's expiry; the meta's `n` grows by the markers written.
local function writeMarkers(bucket, subs, digests, value, expiresAt)
  if #digests == 0 then return end
  local meta = metaKey(bucket)
  local order, groups, subOfKey = groupBy(subs, bucket, digests)
  local expiry = expiring(meta)
  for _, key in ipairs(order) do
    local group = groups[key]
    for from = 1, #group, CHUNK do
      local args = {}
      for j = from, math.min(from + CHUNK - 1, #group) do
        args[#args + 1] = group[j]
        args[#args + 1] = value
      end
      redis.call('HSET', key, unpack(args))
    end
    expiry.ensure(subOfKey[key], key, expiresAt)
  end
  expiry.save()
  redis.call('HINCRBY', meta, 'n', #digests)
end
