-- All-or-nothing count increments, pasted in by the loader at `-- @include
-- count_apply` in write_counts.lua and atomic_batch.lua.

local function negate(delta)
  if delta == '0' then return '0' end
  if string.sub(delta, 1, 1) == '-' then return string.sub(delta, 2) end
  return '-' .. delta
end

-- Keys an INCRBY succeeded on (so they hold an integer): the only ones that get the count TTL.
local touched = {}

-- Applies INCRBY keys[i] deltas[i] for every i, all or nothing. Returns nil,
-- or the position and error of the refused increment after taking back the
-- ones before it (the inverse of an increment that succeeded cannot fail). A
-- key taken back to 0 is deleted: the INCRBY may have created it, and a
-- count of 0 reads the same as no key.
local function addAll(keys, deltas)
  for i = 1, #keys do
    local reply = redis.pcall('INCRBY', keys[i], deltas[i])
    if type(reply) == 'table' and reply.err then
      for j = i - 1, 1, -1 do
        if redis.call('INCRBY', keys[j], negate(deltas[j])) == 0 then redis.call('DEL', keys[j]) end
      end
      return i, reply.err
    end
    touched[keys[i]] = true
  end
  return nil
end
