#!lua
--[[
  Two-step mode, step 3: occupies the markers of a batch's new parts, after
  their counts were written (invariant 2).

  Input:
    KEYS[1]       the batch's write receipt (write_counts.lua left it with the counts)
    KEYS[2..n+1]  the markers to occupy
    ARGV[1]       marker TTL, seconds

  Output:
    n, the number of markers set; or -1, and nothing set, when the receipt
    is gone.

  The receipt check keeps invariant 2 across a failover: the count write may
  have landed on a master that died before its replica had it, and this
  step's retry reaches the promoted replica. Markers set there would stand
  for counts that no longer exist, and the batch would be acked (its WAIT
  answered by the new master's replicas) with its counts lost. The receipt
  is written in the same script as the counts, so it is there exactly when
  they are; without it the caller reruns the whole batch (same batch id), and
  the rerun writes the counts again.

  SET is idempotent: a retry simply sets them again.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
for i = 2, #KEYS do redis.call('SET', KEYS[i], '1', 'EX', ARGV[1]) end
return #KEYS - 1
