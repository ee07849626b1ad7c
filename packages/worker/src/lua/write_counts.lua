#!lua
--[[
  Two-step mode, step 2: writes a batch's counts, all of them or none.

  Input:
    KEYS[1]       the batch's write receipt
    KEYS[2..n+1]  its count keys
    ARGV[1]       count TTL, seconds
    ARGV[2]       receipt TTL, seconds (the marker TTL)
    ARGV[3..n+2]  one delta per count key, as a decimal string (Redis parses
                  it as a 64-bit integer; Lua never turns it into a double)

  Output:
    {refused, alreadyWritten}
      refused         increments Redis refused (overflow, a foreign value)
      alreadyWritten  1 when the receipt was there: nothing was written again

  A script runs atomically, so the counts land together or not at all, and
  the receipt written with them makes a retry after a lost reply a no-op
  instead of a second count. INCRBY runs under pcall: a refused increment is
  counted and does not stop the rest of the batch.
]]
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, 1} end
local refused = 0
for i = 2, #KEYS do
  local reply = redis.pcall('INCRBY', KEYS[i], ARGV[i + 1])
  if type(reply) == 'table' and reply.err then refused = refused + 1 end
  redis.call('EXPIRE', KEYS[i], ARGV[1])
end
redis.call('SET', KEYS[1], refused, 'EX', ARGV[2])
return {refused, 0}
