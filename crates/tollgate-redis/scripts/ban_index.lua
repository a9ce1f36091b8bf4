-- Cluster: keeps the ban index, which lives in a slot of its own, after bans were written
-- (offend.lua, ban.lua) or lifted (unban.lua) in their own slots.
-- KEYS[1]  the ban index (ZSET: ban key -> end of ban µs)
-- ARGV     1 now (see prelude.lua), 2 how many bans to add, then per ban: end µs, ban key;
--          then the ban keys to remove
-- Reply    how many entries the index holds once trimmed of the bans that ended

--@include ban_writer.lua

local index = KEYS[1]
local adds = tonumber(ARGV[2])
for i = 3, 2 + 2 * adds, 2 do
  redis.call('ZADD', index, ARGV[i], ARGV[i + 1])
end
for i = 3 + 2 * adds, #ARGV do
  redis.call('ZREM', index, ARGV[i])
end
trim_ban_index(index)
return redis.call('ZCARD', index)
