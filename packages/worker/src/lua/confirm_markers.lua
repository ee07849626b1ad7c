#!lua
--[[
  Before a batch's WAIT (replica-wait.ts): every marker the batch relies on
  must exist on the master that will answer the WAIT, and the last one is
  touched, a write of this connection's own for the WAIT to follow.

  Input:
    KEYS[1..n]  the markers the batch relies on: those it occupied and those
                it found occupied (its duplicates); KEYS[n] is touched
    ARGV[1]     marker TTL, milliseconds

  Output:
    the number of those markers that do not exist (0: all there, and KEYS[n]
    touched; otherwise nothing written)

  Why every marker, not one: after a failover the WAIT is answered by the
  promoted replica's own replicas. A marker this batch found on the old
  master (a duplicate whose writer's writes were not yet replicated), or
  occupied there, may be missing on the new master while another one is
  present; acking on the strength of the present one would lose the parts
  of the missing one. Missing markers make the caller rerun the batch.

  A marker whose TTL has run below half is given the full TTL again: a batch
  that waits for its replicas a long time (a replica down for longer than
  the marker TTL) must not see its own markers expire and count its parts a
  second time on the rerun. Otherwise a single write, the PEXPIRE of KEYS[n]:
  replicated after everything this master had run before it.
]]
local ttl = tonumber(ARGV[1])
local missing = 0
for i = 1, #KEYS do
  local left = redis.call('PTTL', KEYS[i])
  if left == -2 then
    missing = missing + 1
  elseif left >= 0 and left < ttl / 2 then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
if missing > 0 then return missing end
redis.call('PEXPIRE', KEYS[#KEYS], ttl)
return 0
