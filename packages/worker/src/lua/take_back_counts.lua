#!lua
--[[
  Two-step mode on a Redis Cluster: takes back, on one count shard, the
  increments a batch's parts made there (cross-slot-counts.ts: a part
  refused on another shard, or a batch abandoned for a shard's data). Each
  part is taken back under its own receipt, `<batch id>~undo:<part>`, so a
  part is taken back once per shard whatever ran before; one call takes
  back every part of the shard, as one write_counts wrote them.

  Input:
    KEYS[1..p]    the parts' take-back receipts (this shard's slot)
    KEYS[p+1..]   the count keys
    ARGV[1]       the TTL a count key created here gets, seconds
    ARGV[2]       receipt TTL, seconds (the marker TTL)
    ARGV[3]       p, the number of parts
    ARGV[4..]     per part in KEYS order: k, then k pairs (count key index
                  in KEYS, delta to add: the part's increment negated).
                  Deltas are decimal strings (64-bit integers, never Lua
                  doubles).
    Fenced adoption (write_counts' 'chains'): ARGV[4] is 'chains', KEYS[p+1]
    the batch's write receipt here, then per part in KEYS order its 16-byte
    digest, c and c KEYS indexes: the write receipts of the chain it was
    adopted from here (c is 0 for a part this batch wrote itself); the
    parts' changes follow. A part an adopter relied on this batch for here
    (its digest in the receipt's `~adopted`), or one this batch adopted
    whose chain receipt another adopter has taken over since (`~adopted`
    maps it to another receipt), is not taken back: that adopter owns it
    now. The digest of every part taken back joins the receipt's `~out`,
    and its chain's, so that an adopter that comes later writes it again.

  Output:
    one {outcome, refusals} per part, in KEYS order
      outcome   'taken': taken back now; 'receipt': its receipt was there
                (taken back before: nothing done again, that take-back's
                refusals returned); 'foreign': its receipt key holds
                another type or a value no take-back writes, nothing done
                for it, refusals is the error (Redis's, or
                TALLY_FOREIGN_RECEIPT naming the key); 'adopted': an
                adopter relies on its counts here (fenced adoption), nothing
                done for it
      refusals  one {change index, count key, delta, Redis error} per
                increment Redis refused to take back (the key changed since
                the write): those increments stand. The receipt holds them,
                as write_counts' 'parts' layout writes its refusals.

  Errors:
    TALLY_SCRIPT_ARGS  p is missing or does not match KEYS, a change names
                       no count key or has no integer delta, or the parts'
                       changes do not add up to ARGV; nothing was written
    OOM                (the #!lua line) Redis is out of memory; nothing was
                       written
]]
local countTtl = ARGV[1]
local receiptTtl = ARGV[2]
local p = tonumber(ARGV[3])
if not p or p < 1 or p > #KEYS then return redis.error_reply('TALLY_SCRIPT_ARGS ' .. tostring(ARGV[3]) .. ' parts for ' .. #KEYS .. ' keys') end
local chains = ARGV[4] == 'chains'
-- The first ARGV of the changes, and the last KEYS index that is not a count key.
local first, lastNotCount = 4, p
local written, digests, chainOf = nil, {}, {}
if chains then
  lastNotCount = p + 1
  written = KEYS[p + 1]
  if not written then return redis.error_reply('TALLY_SCRIPT_ARGS no write receipt after the ' .. p .. ' take-back receipts') end
  -- Keys of ours or none: a foreign type would stop the script after its first take-backs.
  for suffix, want in pairs({['~adopted'] = 'hash', ['~out'] = 'set'}) do
    local kind = redis.call('TYPE', written .. suffix)['ok']
    if kind ~= 'none' and kind ~= want then return redis.error_reply('TALLY_FOREIGN_RECEIPT ' .. written .. suffix .. ' holds a ' .. kind .. ', not a ' .. want) end
  end
  first = 5
  for i = 1, p do
    digests[i] = ARGV[first]
    local c = tonumber(ARGV[first + 1])
    if not digests[i] or #digests[i] ~= 16 or not c or c < 0 or c % 1 ~= 0 then
      return redis.error_reply('TALLY_SCRIPT_ARGS ARGV[' .. first .. '] is not a 16-byte digest and its chain length')
    end
    chainOf[i] = {}
    for j = 1, c do
      local keyAt = tonumber(ARGV[first + 1 + j])
      if not keyAt or keyAt <= p + 1 or keyAt > #KEYS or keyAt % 1 ~= 0 then
        return redis.error_reply('TALLY_SCRIPT_ARGS ARGV[' .. (first + 1 + j) .. '] names no chain receipt')
      end
      chainOf[i][j] = KEYS[keyAt]
      for suffix, want in pairs({['~adopted'] = 'hash', ['~out'] = 'set'}) do
        local kind = redis.call('TYPE', KEYS[keyAt] .. suffix)['ok']
        if kind ~= 'none' and kind ~= want then return redis.error_reply('TALLY_FOREIGN_RECEIPT ' .. KEYS[keyAt] .. suffix .. ' holds a ' .. kind .. ', not a ' .. want) end
      end
    end
    first = first + 2 + c
  end
end

-- Checked before any write: a take-back cut short would leave parts without their receipts.
local at = first
for _ = 1, p do
  local k = tonumber(ARGV[at])
  if not k or k < 0 or k % 1 ~= 0 or at + 2 * k > #ARGV then
    return redis.error_reply('TALLY_SCRIPT_ARGS no change count, or too few ARGV for it, at ARGV[' .. at .. ']')
  end
  for c = 1, k do
    local keyAt = tonumber(ARGV[at + 2 * c - 1])
    if not keyAt or keyAt <= lastNotCount or keyAt > #KEYS or keyAt % 1 ~= 0 then
      return redis.error_reply('TALLY_SCRIPT_ARGS ARGV[' .. (at + 2 * c - 1) .. '] names no count key')
    end
    if not string.match(ARGV[at + 2 * c], '^%-?%d+$') then
      return redis.error_reply('TALLY_SCRIPT_ARGS ARGV[' .. (at + 2 * c) .. '] is not an integer')
    end
  end
  at = at + 1 + 2 * k
end
if at ~= #ARGV + 1 then return redis.error_reply('TALLY_SCRIPT_ARGS the parts take ' .. (at - 1) .. ' ARGV, not ' .. #ARGV) end

-- What a take-back receipt says: '1' (nothing stands) or the flags and refusals, as this script writes them; a value
-- of any other shape is not ours, and is reported as a foreign key (read as a receipt, its part would pass for
-- taken back while its increments stand, unreported).
local function readReceipt(receipt, value)
  if value == '1' then return {'receipt', {}} end
  local flags, json = string.match(value, '^([01]+):(.+)$')
  if flags then
    local ok, refusals = pcall(cjson.decode, json)
    if ok and type(refusals) == 'table' then return {'receipt', refusals} end
  end
  return {'foreign', 'TALLY_FOREIGN_RECEIPT ' .. receipt .. ' holds a value that is not a take-back receipt'}
end

-- @include count_apply

-- A part this batch adopted here whose chain receipt another adopter took over since: it is that adopter's now.
local function adoptedSince(part)
  for _, chained in ipairs(chainOf[part]) do
    local by = redis.call('HGET', chained .. '~adopted', digests[part])
    if by and by ~= written then return true end
  end
  return false
end

local replies = {}
local out = {}
local pos = first
for part = 1, p do
  local k = tonumber(ARGV[pos])
  local receipt = KEYS[part]
  local done = redis.pcall('GET', receipt)
  if type(done) == 'table' and done.err then
    replies[part] = {'foreign', done.err}
  elseif done then
    replies[part] = readReceipt(receipt, done)
  elseif chains and (redis.call('HEXISTS', written .. '~adopted', digests[part]) == 1 or adoptedSince(part)) then
    replies[part] = {'adopted', {}}
  else
    -- Each increment on its own: a key changed since the write refuses only its own, and every other one is taken back.
    local flags, refusals = {}, {}
    for c = 1, k do
      local keyAt = pos + 2 * c - 1
      local key = KEYS[tonumber(ARGV[keyAt])]
      local at, err = addAll({key}, 0, ARGV, keyAt, 1, nil, '')
      flags[c] = at and '1' or '0'
      if at then refusals[#refusals + 1] = {c, key, ARGV[keyAt + 1], err} end
    end
    if #refusals == 0 then
      redis.call('SET', receipt, '1', 'EX', receiptTtl)
    else
      redis.call('SET', receipt, table.concat(flags) .. ':' .. cjson.encode(refusals), 'EX', receiptTtl)
    end
    replies[part] = {'taken', refusals}
    if chains then
      out[#out + 1] = digests[part]
      for _, chained in ipairs(chainOf[part]) do
        redis.call('SADD', chained .. '~out', digests[part])
        redis.call('EXPIRE', chained .. '~out', countTtl)
      end
    end
  end
  pos = pos + 1 + 2 * k
end
if #out > 0 then
  -- In chunks: Lua's unpack stops at a few thousand values.
  for from = 1, #out, 1000 do redis.call('SADD', written .. '~out', unpack(out, from, math.min(from + 999, #out))) end
  redis.call('EXPIRE', written .. '~out', countTtl)
end
return replies
