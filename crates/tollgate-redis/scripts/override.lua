-- Per-identity overrides (see check.lua for the value a check reads): set one, remove one, or
-- read the index of the live ones.
-- ARGV[1] now (see prelude.lua); ARGV[2] what to do:
--   'set'     KEYS[1] the override key, KEYS[2] the index (a standalone server; absent on a
--             Cluster, where the store updates the index itself); ARGV 3 the fingerprint of the
--             limiter's rules, 4 how long it lasts µs (0: until removed), 5 the limits
--             ("limit:limit:...", one per rule), 6 what a listing reads (policy, limiter, value
--             on lines of their own). Reply: when it ends µs (0: never)
--   'remove'  KEYS as for 'set'. Reply: 1 if a live override was removed, else 0
--   'ends'    KEYS[1] the override key. Reply: when it ends µs (0: never), or -1 if there is
--             no live override (what a Cluster's index entry must say, see overrides.rs)
--   'page'    KEYS[1] the index (trimmed of the overrides that have ended); ARGV 3 the page
--             size (at least 1), 4 and 5 the cursor: the end (µs, or 'inf' for never) and key
--             of the last override of the previous page, or '' and '' for the first page.
--             Reply, flat: the next cursor (end as text, key), or '' and '' after the last
--             page; now (µs, as text); then each override's key, in the order they end, then
--             by key (the index's own order). O(log n + page size) (see index.lua's
--             index_page).
-- The index is a sorted set of override keys scored by their end (+inf: never).

--@include index.lua

local what = ARGV[2]

if what == 'page' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
  return index_page(KEYS[1], math.max(1, tonumber(ARGV[3]) or 1), ARGV[4], ARGV[5])
end

if what == 'ends' then
  local o = redis.call('GET', KEYS[1])
  local ends = o and tonumber(string.match(o, '^%d+:(%d+):'))
  if ends and (ends == 0 or ends > now) then
    return ends
  end
  return -1
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
