-- Duplicate guard: mark an in-progress lock completed with its response, kept for a while.
-- KEYS[1]  the lock (see lock_acquire.lua)
-- ARGV     1 now (see prelude.lua), 2 token, 3 response, 4 keep for µs
-- Reply    1 when done (or done already by this token with this response: a call run twice),
--          0 when the token does not hold it, it has expired or is completed otherwise

local held = redis.call('HMGET', KEYS[1], 'e', 't', 'c', 'r')
local deadline = tonumber(held[1] or '')
if deadline and deadline > now and held[2] == ARGV[2] and held[3] ~= '1' then
  local keep = tonumber(ARGV[4])
  redis.call('HSET', KEYS[1], 'c', 1, 'r', ARGV[3], 'e', int(now + keep))
  redis.call('PEXPIRE', KEYS[1], ttl_ms(keep))
  return 1
end
if deadline and deadline > now and held[2] == ARGV[2] and held[3] == '1' and held[4] == ARGV[3] then
  return 1
end
return 0
