-- tollgate: the shared head of the guard scripts (lock_*.lua, ban.lua, unban.lua, bans.lua,
-- ban_count.lua, ban_index.lua, and the Cluster's banned.lua, offend.lua, undo.lua); the store
-- prepends it to each of them.
--
-- ARGV[1] is always the time: "" to read the server's TIME (production: one clock), or a test
-- clock's µs since the epoch. With a test clock, keys get an hour more TTL (see common.lua).
-- Deadlines are stored in the values and compared with `now`, so answers never depend on when
-- Redis expires a key.

--@include common.lua

if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
  ttl_slack_ms = 3600000
end

local function int(x)
  return format('%d', x)
end

-- Sets `key` to `value`, keeping its TTL (KEEPTTL needs Redis 6; PTTL keeps older servers
-- working).
local function keep_ttl(key, value)
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then
    redis.call('SET', key, value, 'PX', ttl)
  else
    redis.call('SET', key, value)
  end
end
