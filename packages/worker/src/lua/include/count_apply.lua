-- All-or-nothing count increments, pasted in by the loader at `-- @include
-- count_apply` in write_counts.lua and atomic_batch.lua. Each script sets
-- `countTtl` (the TTL a count key is given, seconds) before using them.

local function negate(delta)
  if delta == '0' then return '0' end
  if string.sub(delta, 1, 1) == '-' then return string.sub(delta, 2) end
  return '-' .. delta
end

-- Applies INCRBY keys[keyAt + i] deltas[deltaAt + i] for i = 1..count, all
-- or nothing; where `instead` (optional, by i) holds a value, that delta is
-- used in its place, and false skips i. Offsets let a caller pass KEYS and
-- ARGV themselves, without copying them into new tables.
-- Returns nil, or the position, error, key and delta of the refused
-- increment after taking back the ones before it (the inverse of an
-- increment that succeeded cannot fail). A key taken back to 0 is deleted:
-- the INCRBY may have created it, and a count of 0 reads the same as no key.
-- A key an INCRBY succeeded on (so it holds an integer) gets the count TTL
-- when `refresh` (a string, one character per i) has '1' at i, when the
-- INCRBY may have created it (its value is the delta), or always when
-- `refresh` is nil; never a key the INCRBY refused, so a foreign key is
-- never touched. Skipping the others is what keeps the TTL refresh off the
-- per-batch cost: the worker asks for it about once an hour per key.
local function addAll(keys, keyAt, deltas, deltaAt, count, instead, refresh)
  for i = 1, count do
    local delta = deltas[deltaAt + i]
    if instead then
      local other = instead[i]
      if other ~= nil then delta = other end
    end
    if delta ~= false then
      local key = keys[keyAt + i]
      local reply = redis.pcall('INCRBY', key, delta)
      if type(reply) == 'table' and reply.err then
        for j = i - 1, 1, -1 do
          local back = deltas[deltaAt + j]
          if instead then
            local other = instead[j]
            if other ~= nil then back = other end
          end
          if back ~= false and redis.call('INCRBY', keys[keyAt + j], negate(back)) == 0 then redis.call('DEL', keys[keyAt + j]) end
        end
        return i, reply.err, key, delta
      end
      if refresh == nil or string.byte(refresh, i) == 49 or reply == tonumber(delta) then redis.call('EXPIRE', key, countTtl) end
    end
  end
  return nil
end
