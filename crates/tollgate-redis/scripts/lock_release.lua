-- Duplicate guard: delete the lock if this token holds it (compare-and-delete).
-- KEYS[1]  the lock (see lock_acquire.lua)
-- ARGV     1 now (see prelude.lua), 2 token
-- Reply    1 when deleted, 0 when someone else holds it or it has expired

local held = redis.call('HMGET', KEYS[1], 'e', 't')
local deadline = tonumber(held[1] or '')
if deadline and deadline > now and held[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
