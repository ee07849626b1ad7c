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
    'chains': fenced adoption (bench/results/notes/cluster-floor.md): as
             'parts', with ARGV[5] the prior refusals as in 'rewrite' ('[]'
             for a first write; the parts they name are sent too, for
             their digests, and stay refused), ARGV[6] o and ARGV[7..o+6]
             the digests of the batch's parts with changes here that this
             run does not write (held by another batch's claim: they join
             `~out`, or an adopter would take this receipt for them), and,
             per part from ARGV[o+7]: its batch
             index, its 16-byte digest, c, c KEYS indexes of the write
             receipts here of the batches whose claims on it this batch
             took over (its chain, oldest first), k, then k pairs. A part
             an earlier batch of its chain left counted here is adopted:
             not written again. Every receipt of a chain that is not here
             is fenced first ('fenced', for the count TTL), so its batch
             can never write here; one that is here and does not list the
             digest in `<receipt>~out` counted it, and its
             `<receipt>~adopted` (a hash) maps the digest to KEYS[1]: the
             adopter take_back_counts then leaves it to. The digest of
             every part this batch does not leave counted here (refused,
             adopted, or held) joins KEYS[1]`~out`.
    Deltas are decimal strings (64-bit integers, never Lua doubles).

  Output:
    {outcome, refusedParts, refusals}
      outcome       'written'; 'receipt' when the receipt was there (a rerun:
                    nothing written again, the first run's answer returned);
                    'isolate' when Redis refused a sum ('sums' only): nothing
                    was written, call again with 'parts'; 'fenced' when an
                    adopter fenced this batch out of this shard: nothing
                    written, now or ever
      refusedParts  '' when no part was refused or adopted, else one
                    character per batch part, '1' for a refused part, '2'
                    for an adopted one ('chains' only)
      refusals      one {part index, count key, delta, Redis error} per
                    refused part (the first change Redis refused in it)

  Errors:
    TALLY_SCRIPT_ARGS  an unknown layout, a prior refusal that names no
                       part or a part sent ('rewrite'), or a 'chains' part
                       whose index, digest, chain or changes do not parse;
                       nothing was written
    OOM                (the #!lua line) Redis is out of memory; nothing was
                       written
]]
local done = redis.call('GET', KEYS[1])
if done == 'fenced' then return {'fenced', '', {}} end
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

if layout == 'chains' then
  local n = tonumber(ARGV[4])
  if not n or n < 1 or n % 1 ~= 0 then return redis.error_reply('TALLY_SCRIPT_ARGS no part count at ARGV[4]') end
  local ok, prior = pcall(cjson.decode, ARGV[5] or '')
  if not ok or type(prior) ~= 'table' then return redis.error_reply('TALLY_SCRIPT_ARGS the prior refusals at ARGV[5] are not a JSON list') end
  local priorRefused = {}
  for _, refusal in ipairs(prior) do priorRefused[tonumber(refusal[1]) or -1] = true end
  local out = {}
  local o = tonumber(ARGV[6])
  if not o or o < 0 or o % 1 ~= 0 or 6 + o > #ARGV then return redis.error_reply('TALLY_SCRIPT_ARGS no held digest count at ARGV[6]') end
  for j = 7, 6 + o do
    if #ARGV[j] ~= 16 then return redis.error_reply('TALLY_SCRIPT_ARGS ARGV[' .. j .. '] is not a 16-byte digest') end
    out[#out + 1] = ARGV[j]
  end

  -- Every part parsed before the first write: a call cut short would leave a shard half adopted.
  local parts = {}
  local at = 7 + o
  while at <= #ARGV do
    local index, digest, c = tonumber(ARGV[at]), ARGV[at + 1], tonumber(ARGV[at + 2])
    if not index or index < 1 or index > n or index % 1 ~= 0 or not digest or #digest ~= 16 or not c or c < 0 or c % 1 ~= 0 then
      return redis.error_reply('TALLY_SCRIPT_ARGS the part at ARGV[' .. at .. '] has no index of ' .. n .. ', 16-byte digest or chain length')
    end
    local chain = {}
    for j = 1, c do
      local keyAt = tonumber(ARGV[at + 2 + j])
      if not keyAt or keyAt < 2 or keyAt > #KEYS or keyAt % 1 ~= 0 then
        return redis.error_reply('TALLY_SCRIPT_ARGS ARGV[' .. (at + 2 + j) .. '] names no receipt in KEYS')
      end
      chain[j] = KEYS[keyAt]
    end
    at = at + 3 + c
    local k = tonumber(ARGV[at])
    if not k or k < 0 or k % 1 ~= 0 or at + 2 * k > #ARGV then
      return redis.error_reply('TALLY_SCRIPT_ARGS no change count, or too few ARGV for it, at ARGV[' .. at .. ']')
    end
    local keys, deltas = {}, {}
    for j = 1, k do
      local keyAt, delta = tonumber(ARGV[at + 2 * j - 1]), ARGV[at + 2 * j]
      if not keyAt or keyAt < 2 or keyAt > #KEYS or keyAt % 1 ~= 0 or not string.match(delta, '^%-?%d+$') then
        return redis.error_reply('TALLY_SCRIPT_ARGS the change at ARGV[' .. (at + 2 * j - 1) .. '] names no count key or has no integer delta')
      end
      keys[j], deltas[j] = KEYS[keyAt], delta
    end
    at = at + 1 + 2 * k
    parts[#parts + 1] = {index = index, digest = digest, chain = chain, keys = keys, deltas = deltas}
  end

  -- Keys of ours or none: a foreign type would stop the script after its first writes.
  local function check(key, want)
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'none' and kind ~= want then return 'TALLY_FOREIGN_RECEIPT ' .. key .. ' holds a ' .. kind .. ', not a ' .. want end
  end
  local foreign = check(KEYS[1] .. '~out', 'set')
  for _, part in ipairs(parts) do
    for _, receipt in ipairs(part.chain) do
      foreign = foreign or check(receipt .. '~out', 'set') or check(receipt .. '~adopted', 'hash')
    end
  end
  if foreign then return redis.error_reply(foreign) end

  -- Did a batch of the chain leave this part counted here? Each receipt that is not here is fenced on the way.
  local function countedBefore(digest, chain)
    local counted = false
    for _, receipt in ipairs(chain) do
      local state = redis.pcall('GET', receipt)
      if state == false then
        redis.call('SET', receipt, 'fenced', 'EX', countTtl)
      elseif type(state) == 'string' and state ~= 'fenced' and redis.call('SISMEMBER', receipt .. '~out', digest) == 0 then
        -- (A receipt key of another type is no receipt: its batch's write fails there for its data, and counted nothing.)
        counted = true
        redis.call('HSET', receipt .. '~adopted', digest, KEYS[1])
        redis.call('EXPIRE', receipt .. '~adopted', countTtl)
      end
    end
    return counted
  end

  local flags = {}
  for i = 1, n do flags[i] = '0' end
  local refusals = {}
  for _, refusal in ipairs(prior) do refusals[#refusals + 1] = refusal end
  for _, part in ipairs(parts) do
    if priorRefused[part.index] then
      flags[part.index] = '1'
      out[#out + 1] = part.digest
    elseif countedBefore(part.digest, part.chain) then
      flags[part.index] = '2'
      out[#out + 1] = part.digest
    else
      local refusedAt, err = addAll(part.keys, 0, part.deltas, 0, #part.keys)
      if refusedAt then
        flags[part.index] = '1'
        out[#out + 1] = part.digest
        refusals[#refusals + 1] = {part.index, part.keys[refusedAt], part.deltas[refusedAt], err}
      end
    end
  end
  if #out > 0 then
    -- In chunks: Lua's unpack stops at a few thousand values.
    for from = 1, #out, 1000 do redis.call('SADD', KEYS[1] .. '~out', unpack(out, from, math.min(from + 999, #out))) end
    redis.call('EXPIRE', KEYS[1] .. '~out', countTtl)
  end
  local flagged = table.concat(flags)
  if not string.find(flagged, '[12]') then
    redis.call('SET', KEYS[1], '1', 'EX', receiptTtl)
    return {'written', '', {}}
  end
  redis.call('SET', KEYS[1], flagged .. ':' .. (#refusals == 0 and '[]' or cjson.encode(refusals)), 'EX', receiptTtl)
  return {'written', flagged, refusals}
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
