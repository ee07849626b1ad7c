#!lua
--[[
  Before a stream batch's WAIT (replica-wait.ts): checks that the shard's
  watermarks still reach what the batch applied or found applied, then
  writes a touch for the WAIT to follow. The key layout is in
  docs/architecture.md ("Redis keys").

  Input:
    KEYS[1]     the shard's watermarks, <prefix>wm:{<vshard>}
    KEYS[2]     the shard's touch key, <prefix>wm:{<vshard>}:touch (the
                same slot)
    ARGV[1 ..]  pairs: a partition, and the offset its watermark must reach
                (decimal)

  Output:
    the number of partitions whose watermark is below its offset (0: all
    reached, and the touch written; otherwise nothing written: the writes
    are gone, rerun the batch)

  Errors:
    OOM         (the #!lua line) Redis is out of memory; nothing was written
]]
if redis.replicate_commands then redis.replicate_commands() end
local missing = 0
for i = 1, #ARGV, 2 do
  local watermark = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if watermark == nil or watermark < tonumber(ARGV[i + 1]) then missing = missing + 1 end
end
if missing == 0 then redis.call('INCR', KEYS[2]) end
return missing
