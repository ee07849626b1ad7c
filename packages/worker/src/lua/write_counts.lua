#!lua
--[[
  Two-step mode, step 2: writes a batch's counts and its write receipt, all
  of them or none. The key layout is in docs/architecture.md ("Redis
  keys"); how refusals are handled, in its "The scripts" section.

  Input:
    KEYS[1]       the batch's write receipt (keyed by the coordinator's batch id)
    KEYS[2..m+1]  its count keys
    ARGV[1]       the TTL a count key gets, seconds
    ARGV[2]       receipt TTL, seconds (the marker TTL)
    ARGV[3]       layout of the rest: 'sums', 'parts' or 'rewrite'
    'sums':  ARGV[4]       refresh: one character per count key, '1' when its
                           TTL is to be set even if it exists (a new key
                           always gets it)
             ARGV[5..m+4]  one delta per count key: the batch's new parts
                           summed per SKU
    'parts': ARGV[4]       N, the number of parts in the batch (every written
                           key gets its TTL)
             ARGV[5..]     per new part: its batch index (1..N), k, then k
                           pairs (count key index 1..m, delta)
    'rewrite': a lost receipt written again (cross-slot-counts.ts): as
             'parts', with ARGV[5] the lost receipt's refusals (JSON, as the
             receipt held them) and the parts from ARGV[6]. The parts they
             name are not written again, and the new receipt holds them
             too, so the rewrite reproduces the lost write: a part refused
             there stays refused, whatever the keys hold now.
    Deltas are decimal strings (64-bit integers, never Lua doubles).

  Output:
    {outcome, refusedParts, refusals}
      outcome       'written'; 'receipt' when the receipt was there (a rerun:
                    nothing written again, the first run's answer returned);
                    'isolate' when Redis refused a sum ('sums' only): nothing
                    was written, call again with 'parts'
      refusedParts  '' when no part was refused, else one character per
                    batch part, '1' for a refused part
      refusals      one {part index, count key, delta, Redis error} per
                    refused part (the first change Redis refused in it)

  Errors:
    TALLY_SCRIPT_ARGS  an unknown layout, or a prior refusal that names no
                       part or a part sent; nothing was written
    OOM                (the #!lua line) Redis is out of memory; nothing was
                       written
]]
local done = redis.call('GET', KEYS[1])
if done then
  -- '1' (or the refused count of an older receipt): nothing was refused.
  local sep = string.find(done, ':', 1, true)
  if not sep then return {'receipt', '', {}} end
  return {'receipt', string.sub(done, 1, sep - 1), cjson.decode(string.sub(done, sep + 1))}
end

local countTtl = ARGV[1]
local receiptTtl = ARGV[2]
local layout = ARGV[3]
local m = #KEYS - 1

-- @include count_apply

if layout == 'sums' then
  -- KEYS[2..m+1] and ARGV[5..m+4] as they are: no copies on the usual path.
  local refused = addAll(KEYS, 1, ARGV, 4, m, nil, ARGV[4])
  if refused then return {'isolate', '', {}} end
  redis.call('SET', KEYS[1], '1', 'EX', receiptTtl)
  return {'written', '', {}}
end

if layout ~= 'parts' and layout ~= 'rewrite' then return redis.error_reply('TALLY_SCRIPT_ARGS unknown layout ' .. tostring(layout)) end
local n = tonumber(ARGV[4])
local flags = {}
for i = 1, n do flags[i] = '0' end
local refusals = {}
local pos = 5
if layout == 'rewrite' then
  for _, refusal in ipairs(cjson.decode(ARGV[5])) do
    local part = tonumber(refusal[1])
    if not part or part < 1 or part > n or part % 1 ~= 0 then
      return redis.error_reply('TALLY_SCRIPT_ARGS a prior refusal names part ' .. tostring(refusal[1]) .. ' of ' .. n)
    end
    flags[part] = '1'
    refusals[#refusals + 1] = refusal
  end
  pos = 6
  -- A part the lost write refused is not written again: refused before any write if it is sent.
  local at = pos
  while at <= #ARGV do
    if flags[tonumber(ARGV[at])] == '1' then
      return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. ARGV[at] .. ' is sent and named by a prior refusal')
    end
    local k = tonumber(ARGV[at + 1])
    if k == nil then return redis.error_reply('TALLY_SCRIPT_ARGS part ' .. ARGV[at] .. ' has no change count') end
    at = at + 2 + 2 * k
  end
end
while pos <= #ARGV do
  local part = tonumber(ARGV[pos])
  local k = tonumber(ARGV[pos + 1])
  pos = pos + 2
  local keys, deltas = {}, {}
  for c = 1, k do
    keys[c] = KEYS[1 + tonumber(ARGV[pos])]
    deltas[c] = ARGV[pos + 1]
    pos = pos + 2
  end
  local at, err = addAll(keys, 0, deltas, 0, k)
  if at then
    flags[part] = '1'
    refusals[#refusals + 1] = {part, keys[at], deltas[at], err}
  end
end
if #refusals == 0 then
  redis.call('SET', KEYS[1], '1', 'EX', receiptTtl)
  return {'written', '', {}}
end
local refusedParts = table.concat(flags)
redis.call('SET', KEYS[1], refusedParts .. ':' .. cjson.encode(refusals), 'EX', receiptTtl)
return {'written', refusedParts, refusals}
