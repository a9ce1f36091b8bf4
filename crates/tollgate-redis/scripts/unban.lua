-- Blocklist: lift a ban and forget its strikes.
-- KEYS[1]  the ban (see ban_writer.lua)
-- KEYS[2]  the ban index, where it shares the ban's slot (a standalone server); absent on a
--          Cluster, where the store removes the ban from the index itself (ban_index.lua)
-- ARGV     1 now (see prelude.lua)
-- Reply    1 if the target was banned, else 0

local until_us = tonumber(redis.call('HGET', KEYS[1], 'u') or '')
redis.call('DEL', KEYS[1])
if KEYS[2] then
  redis.call('ZREM', KEYS[2], KEYS[1])
end
if until_us and until_us > now then
  return 1
end
return 0
