#!lua
--[[
  Two-step mode, step 3: occupies the markers of a batch's new parts, after
  their counts were written (invariant 2). The key layout is in
  docs/architecture.md ("Redis keys"); how the script works, in its
  "The scripts" section.

  Input:
    KEYS[1]     the shard's marker base, <prefix>mk:{<vshard>}
    KEYS[2]     the batch's write receipt (write_counts.lua left it with the
                counts); absent when the batch wrote no counts
    ARGV[1]     bucket width, seconds
    ARGV[2]     marker TTL, seconds
    ARGV[3]     sub-buckets of a bucket whose bucket before is unknown (as
                in claim_markers)
    ARGV[4]     filter bits per expected marker of a bucket it opens (as in
                claim_markers)
    ARGV[5]     the bucket the claims are in
    ARGV[6]     their batch: claim_markers's number, or a claim pipeline's
                id (worker/src/native-claims.ts)
    ARGV[7]     r, the number of parts Redis refused to count
    ARGV[8 .. 7+r]  their 16-byte digests: their claims are deleted, so they
                get no marker and their replay counts them (a claim only:
                a field another daemon's claim took over since is left)
    ARGV[8+r ..]    the 16-byte digests of the other new parts: only needed,
                and only sent, when the first call answered -1 (that call
                sends r = 0: the first one deleted the refused claims)

  Output:
    n  the markers occupied; -1: the batch is done in its bucket, and time
       has moved on to a later one, so call again with the digests to write
       them there as done (an empty list is fine); -2: the receipt is gone,
       nothing written (rerun the whole batch under its id)

  Errors:
    TALLY_SCRIPT_ARGS  no filter bits argument; nothing was written
    OOM                (the #!lua line) Redis is out of memory; nothing was
                       written
]]
if redis.replicate_commands then redis.replicate_commands() end
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 0 then return -2 end
local base = KEYS[1]
local width = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local initialSubs = tonumber(ARGV[3])
local filterBits = tonumber(ARGV[4])
if filterBits == nil then return redis.error_reply('TALLY_SCRIPT_ARGS no filter bits argument') end
local claimed = tonumber(ARGV[5])
local batch = ARGV[6]
local refused = tonumber(ARGV[7])
local FIRST = 8 + refused
local nowS = tonumber(redis.call('TIME')[1])
local current = math.floor(nowS / width)

-- @include marker_buckets

-- Done in the claims' bucket first, whatever else: a batch whose new parts
-- were all refused has nothing to move, and must still end here.
local claimSubs = tonumber(redis.call('HGET', metaKey(claimed), 's')) or initialSubs
local touched = {}
for i = 8, 7 + refused do
  local digest = ARGV[i]
  local sub = subOf(digest, claimSubs)
  touched[sub] = base .. ':' .. claimed .. ':' .. sub
  -- Only this batch's own claim: one another daemon took over after ours ran out (this batch stalled) is that
  -- daemon's to occupy, and deleted here it would leave the part it counts without a marker.
  if redis.call('HGET', touched[sub], digest) == batch then redis.call('HDEL', touched[sub], digest) end
end
if refused > 0 then forgetEmptied(metaKey(claimed), touched) end
redis.call('HSET', metaKey(claimed), 'b' .. batch, '1')
if current == claimed then return 0 end
if #ARGV < FIRST then return -1 end

-- A later bucket: open it as claim_markers would, then write the markers there as done.
local expiresAt = (current + 1) * width + ttl
local moved = {}
for i = FIRST, #ARGV do moved[#moved + 1] = ARGV[i] end
writeMarkers(current, openBucket(current, initialSubs, expiresAt), moved, '1', expiresAt)
return #moved
