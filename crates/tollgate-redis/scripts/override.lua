-- Per-identity overrides (see check.lua for the value a check reads): set one, remove one, or
-- read the index of the live ones.
-- ARGV[1] now (see prelude.lua); ARGV[2] what to do:
--   'set'     KEYS[1] the override key, KEYS[2] the index (a standalone server; absent on a
--             Cluster, where the store updates the index itself); ARGV 3 the fingerprint of the
--             limiter's rules, 4 how long it lasts µs (0: until removed), 5 the limits
--             ("limit:limit:...", one per rule), 6 what a listing reads (policy, limiter, value
--             on lines of their own). Reply: when it ends µs (0: never)
--   'remove'  KEYS as for 'set'. Reply: 1 if a live override was removed, else 0
--   'page'    KEYS[1] the index (trimmed of the overrides that have ended); ARGV 3 the page
--             size (at least 1), 4 and 5 the cursor: the end (µs, or 'inf' for never) and key
--             of the last override of the previous page, or '' and '' for the first page.
--             Reply, flat: the next cursor (end as text, key), or '' and '' after the last
--             page; now (µs, as text); then each override's key, in the order they end, then
--             by key (the index's own order). O(log n + page size): the page starts at a rank
--             found by ZCOUNT, so no call walks the overrides before it.
-- The index is a sorted set of override keys scored by their end (+inf: never).

local what = ARGV[2]

if what == 'page' then
  local index = KEYS[1]
  redis.call('ZREMRANGEBYSCORE', index, '-inf', int(now))
  local limit = math.max(1, tonumber(ARGV[3]) or 1)
  local after_us, after_key = nil, ARGV[5]
  if ARGV[4] == 'inf' then
    after_us = math.huge
  elseif ARGV[4] ~= '' then
    after_us = tonumber(ARGV[4])
  end
  -- Every index entry before this rank ends before the cursor's end.
  local rank = 0
  if after_us == math.huge then
    rank = redis.call('ZCOUNT', index, '-inf', '(+inf')
  elseif after_us then
    rank = redis.call('ZCOUNT', index, '-inf', '(' .. int(after_us))
  end
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
      local key, score = batch[i], batch[i + 1]
      local ends = math.huge
      if score ~= 'inf' and score ~= '+inf' then
        ends = tonumber(score)
      end
      rank = rank + 1
      if not (after_us and ends == after_us and key <= after_key) then
        last_us, last_key = ends, key
        out[#out + 1] = key
        found = found + 1
      end
    end
  end
  if rank < total and last_us then
    if last_us == math.huge then
      out[1] = 'inf'
    else
      out[1] = int(last_us)
    end
    out[2] = last_key
  end
  return out
end

if what == 'remove' then
  local o = redis.call('GET', KEYS[1])
  redis.call('DEL', KEYS[1])
  if KEYS[2] then
    redis.call('ZREM', KEYS[2], KEYS[1])
  end
  if not o then
    return 0
  end
  local ends = tonumber(string.match(o, '^%d+:(%d+):'))
  if ends and (ends == 0 or ends > now) then
    return 1
  end
  return 0
end

local lasts = tonumber(ARGV[4])
local ends = 0
if lasts > 0 then
  ends = now + lasts
end
local value = ARGV[3] .. ':' .. int(ends) .. ':' .. ARGV[5] .. '\n' .. ARGV[6]
if ends > 0 then
  redis.call('SET', KEYS[1], value, 'PX', int(ttl_ms(lasts)))
else
  redis.call('SET', KEYS[1], value)
end
if KEYS[2] then
  local score = '+inf'
  if ends > 0 then
    score = int(ends)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now))
  redis.call('ZADD', KEYS[2], score, KEYS[1])
end
return ends
