-- tollgate: the shared head of the guard scripts (lock_*.lua, ban.lua, unban.lua, bans.lua,
-- ban_count.lua, ban_index.lua, refund.lua, redo.lua, override.lua, and the Cluster's
-- banned.lua, offend.lua, undo.lua); the store prepends it to each of them.
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

-- Runs `apply` once per call, for scripts whose second run would change the state again (a
-- refund would give back twice), where the client may send a call twice (a Cluster client
-- re-sends a call whose reply it lost, and both copies may reach the node). The caller names
-- each call by a fresh id, in the marker key it passes last (tollgate::applied_key), and says
-- for how long (`ttl_ms`, an argument: while the client may still send the call again); the
-- first run's reply is kept there, and a second run changes nothing and answers the same.
-- `ttl_ms` 0: no marker is given (a client that never sends a call twice). `apply` returns an
-- integer or a list of integers.
local function once(ttl_ms, apply)
  if ttl_ms <= 0 then
    return apply()
  end
  local marker = table.remove(KEYS)
  local done = redis.call('GET', marker)
  if done then
    if string.sub(done, 1, 1) ~= 'l' then
      return tonumber(done)
    end
    local list = {}
    for n in string.gmatch(done, '-?%d+') do
      list[#list + 1] = tonumber(n)
    end
    return list
  end
  local reply = apply()
  if type(reply) == 'table' then
    if reply.err then
      return reply
    end
    local parts = {}
    for i, n in ipairs(reply) do
      parts[i] = int(n)
    end
    redis.call('SET', marker, 'l' .. table.concat(parts, ','), 'PX', int(ttl_ms))
  else
    redis.call('SET', marker, int(reply), 'PX', int(ttl_ms))
  end
  return reply
end
