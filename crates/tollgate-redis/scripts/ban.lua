-- Blocklist: ban a target by hand for a duration from now, keeping its strike count.
-- KEYS[1]  the ban (see ban_writer.lua)
-- KEYS[2]  the ban index, where it shares the ban's slot (a standalone server); absent on a
--          Cluster, where the store adds the ban to the index itself (ban_index.lua)
-- ARGV     1 now (see prelude.lua), 2 duration µs, 3 target kind, 4 target value
-- Reply    the end of the ban, µs

--@include ban_writer.lua

local old = redis.call('HMGET', KEYS[1], 's', 'x')
local until_us = now + tonumber(ARGV[2])
local strikes, forget_at = 1, until_us
local old_forget = tonumber(old[2] or '')
if old_forget and old_forget > now then
  strikes = tonumber(old[1] or '') or 1
  forget_at = math.max(old_forget, until_us)
end
local index = KEYS[2] or false
put_ban(KEYS[1], until_us, strikes, forget_at, ARGV[3], ARGV[4], index)
if index then
  trim_ban_index(index)
end
return until_us
