-- Blocklist: the index entries of one page of the bans that have not ended, in the order
-- they end, then by key (the index's own order). It reads the index only (a script must
-- touch no key but its KEYS: a Cluster, where the bans live in other slots, and Dragonfly
-- refuse that): the store then reads each listed ban's hash (HMGET), skipping any lifted
-- meanwhile.
-- KEYS[1]  the ban index (ZSET: ban key -> end of ban µs)
-- ARGV     1 now (see prelude.lua), 2 the page size (at least 1), 3 and 4 the cursor: the end
--          (µs) and key of the last ban of the previous page, or '' and '' for the first page
-- Reply    flat: the next cursor (end µs as text, key), or '' and '' after the last page; now
--          (µs, as text); then each ban's key
--
-- Cost: O(log n + page size). The page starts at a rank found by ZCOUNT, so no call walks
-- the bans before it; only the few that share the cursor's end are stepped over.

local index = KEYS[1]
local limit = math.max(1, tonumber(ARGV[2]) or 1)
local after_us = tonumber(ARGV[3])
local after_key = ARGV[4]

local from = now
if after_us and after_us > from then
  from = after_us
end
-- Every index entry before this rank ends before `from`.
local rank = redis.call('ZCOUNT', index, '-inf', '(' .. int(from))
local total = redis.call('ZCARD', index)
local out = { '', '', int(now) }
local found = 0
local last_us, last_key
while found < limit and rank < total do
  local batch = redis.call('ZRANGE', index, rank, rank + limit - found - 1, 'WITHSCORES')
  if #batch == 0 then
    break
  end
  for i = 1, #batch, 2 do
    local key, until_us = batch[i], tonumber(batch[i + 1])
    rank = rank + 1
    local seen = after_us and until_us == after_us and key <= after_key
    if until_us > now and not seen then
      last_us, last_key = until_us, key
      out[#out + 1] = key
      found = found + 1
    end
  end
end
if rank < total and last_us then
  out[1] = int(last_us)
  out[2] = last_key
end
return out
