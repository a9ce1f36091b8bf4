-- Duplicate guard: take a lock if it is free (set-if-absent), or describe its holder.
-- KEYS[1]  the lock (hash: t token, f fingerprint, c completed 0/1, r response, e deadline µs)
-- ARGV     1 now (see prelude.lua), 2 token, 3 fingerprint, 4 ttl µs
-- Reply    {1} when acquired; {0, completed, ttl_left_us, fingerprint, response or nil} when held

local held = redis.call('HMGET', KEYS[1], 'e', 'c', 'f', 'r', 't')
local deadline = tonumber(held[1] or '')
if deadline and deadline > now then
  if held[5] == ARGV[2] and held[2] == '0' then
    -- This very acquisition, run again (a Cluster client re-sends a call whose reply it
    -- lost): the caller holds the lock.
    return { 1 }
  end
  return { 0, tonumber(held[2] or '') or 0, deadline - now, held[3] or '', held[4] }
end
local ttl = tonumber(ARGV[4])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 't', ARGV[2], 'f', ARGV[3], 'c', 0, 'e', int(now + ttl))
redis.call('PEXPIRE', KEYS[1], ttl_ms(ttl))
return { 1 }
