-- Marker buckets: the helpers every marker script needs, pasted in by the
-- loader at `-- @include marker_buckets` (Redis scripts cannot call each
-- other). Each script sets `base`, its shard's marker base
-- <prefix>mk:{<vshard>}, and `filterBits`, bits of filter per expected
-- marker for the buckets it opens (0: none), before using them. The keys
-- these helpers read and write (<base>:<bucket>:<sub>, :m, :f) are described
-- once, in docs/architecture.md ("Redis keys", "Markers", "Marker filters").

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

-- The filter of a bucket: its block count from the meta hash (cached for
-- the script's run), or false when the bucket has none (opened without a
-- filter, or by an older build): then every lookup reads the hashes.
local filterBlocks = {}
local function filterOf(bucket)
  local blocks = filterBlocks[bucket]
  if blocks == nil then
    blocks = tonumber(redis.call('HGET', metaKey(bucket), 'f')) or false
    -- A filter key gone while its bucket lives (deleted by hand) would answer
    -- "not held" for every digest: read the hashes instead.
    if blocks and redis.call('EXISTS', base .. ':' .. bucket .. ':f') == 0 then blocks = false end
    filterBlocks[bucket] = blocks
  end
  return blocks
end

-- A digest's filter coordinates, the same in every bucket: its block word
-- (bytes 5..8, big-endian; the block is that modulo the bucket's block
-- count) and its four bits in the block (bytes 9..12, each modulo 32),
-- independent of the bytes that pick the sub-bucket (1..2) and the marker
-- shard (13..16). Computed once per digest and script: string.byte and the
-- arithmetic are a good part of the script's own time.
local BIT = {}
for i = 0, 31 do BIT[i] = bit.lshift(1, i) end
local wordOfDigest, bitsOfDigest = {}, {}
local function coordinatesOf(digest)
  local word = wordOfDigest[digest]
  if word == nil then
    local b5, b6, b7, b8, b9, b10, b11, b12 = string.byte(digest, 5, 12)
    word = ((b5 * 256 + b6) * 256 + b7) * 256 + b8
    wordOfDigest[digest] = word
    bitsOfDigest[digest] = bit.bor(BIT[b9 % 32], BIT[b10 % 32], BIT[b11 % 32], BIT[b12 % 32])
  end
  return word, bitsOfDigest[digest]
end

-- BITFIELD's offset of a block: string.format, because Lua 5.1 turns a
-- number into a string with %.14g, three times slower ('#' .. n).
local function offsetOf(block)
  return string.format('#%d', block)
end

-- The words mayHold read, by bucket and block, for addToFilter in the same
-- script: nothing else writes a filter between the two (a script is atomic).
local readWords = {}

-- The digests the filter of `bucket` may hold (all of them when it has none):
-- one BITFIELD GET per chunk of digests instead of one HMGET per hash.
local function mayHold(bucket, digests)
  local blocks = filterOf(bucket)
  if not blocks or #digests == 0 then return digests end
  local key = base .. ':' .. bucket .. ':f'
  local kept = {}
  for from = 1, #digests, CHUNK do
    local to = math.min(from + CHUNK - 1, #digests)
    local args = {}
    local blockOfJ = {}
    for j = from, to do
      local word = coordinatesOf(digests[j])
      local block = word % blocks
      blockOfJ[j] = block
      args[#args + 1] = 'GET'
      args[#args + 1] = 'u32'
      args[#args + 1] = offsetOf(block)
    end
    local words = redis.call('BITFIELD', key, unpack(args))
    local known = readWords[bucket]
    if known == nil then
      known = {}
      readWords[bucket] = known
    end
    for j = from, to do
      local digest = digests[j]
      local word = words[j - from + 1]
      known[blockOfJ[j]] = word
      local bits = bitsOfDigest[digest]
      if bit.band(word, bits) == bits then kept[#kept + 1] = digest end
    end
  end
  return kept
end

-- Sets the digests' bits in the filter of `bucket`, if it has one: one
-- BITFIELD GET and one SET per chunk, the bits of digests that share a block
-- merged first (two SETs of one block would keep only the last).
local function addToFilter(bucket, digests)
  local blocks = filterOf(bucket)
  if not blocks then return end
  local key = base .. ':' .. bucket .. ':f'
  for from = 1, #digests, CHUNK do
    local to = math.min(from + CHUNK - 1, #digests)
    local order, wanted = {}, {}
    for j = from, to do
      local word, bits = coordinatesOf(digests[j])
      local block = word % blocks
      local want = wanted[block]
      if want == nil then
        want = 0
        order[#order + 1] = block
      end
      wanted[block] = bit.bor(want, bits)
    end
    -- The words mayHold read in this script need no second read.
    local known = readWords[bucket] or {}
    local args, unknown = {}, {}
    for _, block in ipairs(order) do
      if known[block] == nil then
        unknown[#unknown + 1] = block
        args[#args + 1] = 'GET'
        args[#args + 1] = 'u32'
        args[#args + 1] = offsetOf(block)
      end
    end
    if #unknown > 0 then
      local read = redis.call('BITFIELD', key, unpack(args))
      for i, block in ipairs(unknown) do known[block] = read[i] end
    end
    local words = {}
    for i, block in ipairs(order) do words[i] = known[block] end
    args = {}
    for i, block in ipairs(order) do
      -- As an unsigned 32-bit value: bit.bor answers signed, BITFIELD u32 unsigned.
      local word = bit.bor(words[i], wanted[block]) % 4294967296
      if word ~= words[i] then
        args[#args + 1] = 'SET'
        args[#args + 1] = 'u32'
        args[#args + 1] = offsetOf(block)
        args[#args + 1] = string.format('%d', word)
        known[block] = word
      end
    end
    if #args > 0 then redis.call('BITFIELD', key, unpack(args)) end
  end
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

-- The buckets the worker probed itself (its copies of settled buckets'
-- filters, worker/src/settled-filters.ts), for readBuckets: by bucket, the
-- block count and marker count (meta `n`, -1 when absent) the copy was
-- taken at, and the distinct digests that copy may hold. `buckets` is '' or
-- 'bucket:blocks:markers' joined by ','; `flags` has, per bucket in that
-- order, one character per digest of `digests`, '1' where the copy may
-- hold it.
local function vouchedBuckets(buckets, flags, digests)
  if buckets == nil or buckets == '' then return nil end
  local vouched = {}
  local n = #digests
  local v = 0
  for bucket, blocks, markers in string.gmatch(buckets, '(%d+):(%d+):(-?%d+)') do
    local suspects, taken = {}, {}
    for i = 1, n do
      if string.byte(flags, v * n + i) == 49 then
        local digest = digests[i]
        if not taken[digest] then
          taken[digest] = true
          suspects[#suspects + 1] = digest
        end
      end
    end
    vouched[tonumber(bucket)] = {blocks = tonumber(blocks), markers = tonumber(markers), digests = suspects}
    v = v + 1
  end
  return vouched
end

-- Calls visit(bucket, digest, value) for every digest present in a live
-- bucket (now back to `oldest`), newest first: one HMGET per hash and
-- bucket. A bucket without a meta hash holds no marker and is not read.
-- `vouched` (optional, vouchedBuckets): the buckets the worker probed from
-- its copies of their filters: only the digests a copy may hold are read,
-- and only if the bucket still has the copy's block count and marker count
-- (a marker written since, by a clock set back, means the copy is short of
-- its bits); otherwise the bucket is probed here as any other.
-- Returns the sub-bucket count of `current` (false when it has none yet).
local function readBuckets(current, oldest, digests, visit, vouched)
  local currentSubs = false
  for bucket = current, oldest, -1 do
    local subs = tonumber(redis.call('HGET', metaKey(bucket), 's'))
    if bucket == current then currentSubs = subs or false end
    if subs then
      local probed = vouched and vouched[bucket]
      local candidates
      if probed and filterOf(bucket) == probed.blocks and (tonumber(redis.call('HGET', metaKey(bucket), 'n')) or -1) == probed.markers then
        candidates = probed.digests
      else
        candidates = mayHold(bucket, digests)
      end
      local order, groups = groupBy(subs, bucket, candidates)
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
-- that doubles within a bucket still fits; 16,384 each in a filtered
-- bucket), or `initialSubs` when that one is unknown.
local function openBucket(bucket, initialSubs, expiresAt)
  local meta = metaKey(bucket)
  local subs = tonumber(redis.call('HGET', meta, 's'))
  if subs then return subs end
  local before = tonumber(redis.call('HGET', metaKey(bucket - 1), 'n'))
  -- A filtered bucket's hashes serve the writes, not the lookups: far larger
  -- (shared/src/markers.ts FILTERED_MARKERS_PER_SUB_BUCKET).
  local perHash = filterBits > 0 and 16384 or 64
  subs = initialSubs
  local expected = initialSubs * 64
  if before then
    subs = 1
    while subs < 65536 and subs * perHash < before do subs = subs * 2 end
    expected = before
  end
  redis.call('HSET', meta, 's', subs)
  redis.call('EXPIREAT', meta, expiresAt)
  if filterBits > 0 then
    -- Room for twice the markers the bucket before received (a rate that
    -- doubles within the bucket), so the filter stays sparse; past that it
    -- only answers "may hold" more often, it never misses a digest.
    local blocks = math.max(64, math.ceil(math.max(1, expected) * 2 * filterBits / 32))
    local filter = base .. ':' .. bucket .. ':f'
    redis.call('BITFIELD', filter, 'SET', 'u32', offsetOf(blocks - 1), 0)
    redis.call('EXPIREAT', filter, expiresAt)
    redis.call('HSET', meta, 'f', blocks)
    filterBlocks[bucket] = blocks
  end
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

-- Forgets the expiry of the hashes in `keys` ({sub -> key}) that no longer
-- exist: a hash emptied (HDEL of its last field) is deleted with its TTL,
-- and one recreated later would otherwise keep no expiry, its bit in `x`
-- saying it has one. Only for the rare deletions of refused claims: one
-- EXISTS per hash touched.
local function forgetEmptied(meta, keys)
  local bitmap = redis.call('HGET', meta, 'x')
  if not bitmap then return end
  local changed = false
  for sub, key in pairs(keys) do
    local index = math.floor(sub / 8) + 1
    local bit = 2 ^ (sub % 8)
    local byte = string.byte(bitmap, index)
    if byte and math.floor(byte / bit) % 2 == 1 and redis.call('EXISTS', key) == 0 then
      bitmap = string.sub(bitmap, 1, index - 1) .. string.char(byte - bit) .. string.sub(bitmap, index + 1)
      changed = true
    end
  end
  if changed then redis.call('HSET', meta, 'x', bitmap) end
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
  addToFilter(bucket, digests)
  redis.call('HINCRBY', meta, 'n', #digests)
end
