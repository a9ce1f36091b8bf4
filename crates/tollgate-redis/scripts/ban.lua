-- Blocklist: ban a target by hand for a duration from now, keeping its strike count.
-- KEYS[1]  the ban (hash: u end of ban µs, s strikes, x end of memory µs, k kind, v value)
-- KEYS[2]  the ban index (see prelude.lua)
-- ARGV     1 now (see prelude.lua), 2 duration µs, 3 target kind, 4 target value
-- Reply    1

local old = redis.call('HMGET', KEYS[1], 's', 'x')
local until_us = now + tonumber(ARGV[2])
local strikes, forget_at = 1, until_us
local old_forget = tonumber(old[2] or '')
if old_forget and old_forget > now then
  strikes = tonumber(old[1] or '') or 1
  forget_at = math.max(old_forget, until_us)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'u', int(until_us), 's', int(strikes), 'x', int(forget_at),
  'k', ARGV[3], 'v', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ttl_ms(forget_at - now))
redis.call('ZADD', KEYS[2], int(until_us), KEYS[1])
trim_ban_index(KEYS[2])
return 1
