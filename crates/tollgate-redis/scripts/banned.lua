-- Cluster: reads the identity's bans of one hash slot (a ban key has no hash tag: each lives
-- in its own key's slot) while the limiters' slots run check.lua (the standalone check.lua
-- reads them itself).
-- KEYS     the ban keys (see ban_writer.lua) of one slot
-- ARGV     1 now (see prelude.lua)
-- Reply    µs left of the longest live ban, or -1

local blocked = -1
for _, key in ipairs(KEYS) do
  local until_us = tonumber(redis.call('HGET', key, 'u') or '')
  if until_us and until_us > now and until_us - now > blocked then
    blocked = until_us - now
  end
end
return blocked
