#!lua
--[[
  Two-step mode, step 3: occupies the markers of a batch's new parts, after
  their counts were written (invariant 2).

  Input:
    KEYS[1..n]  the markers to occupy
    ARGV[1]     marker TTL, seconds

  Output:
    n, the number of markers set

  SET is idempotent: a retry simply sets them again.
]]
for i = 1, #KEYS do redis.call('SET', KEYS[i], '1', 'EX', ARGV[1]) end
return #KEYS
