-- tollgate: the shared head of the guard scripts (lock_*.lua, ban.lua, unban.lua, bans.lua,
-- ban_count.lua, and the Cluster's banned.lua, offend.lua, undo.lua); the store prepends it to
-- each of them.
--
-- ARGV[1] is always the time: "" to read the server's TIME (production: one clock), or a test
-- clock's µs since the epoch. With a test clock, keys get an hour more TTL, because that clock
-- may stand still while real time, which PEXPIRE counts, goes on. Deadlines are stored in the
-- values and compared with `now`, so answers never depend on when Redis expires a key.
--
-- Lua numbers are doubles: integers below 2^53 are exact, but tostring() keeps 14 digits and
-- a / b is not floor division, hence int() and divmod().

if redis.replicate_commands then
  -- Redis < 5 refuses writes after TIME unless the script replicates its effects.
  redis.replicate_commands()
end

local now
local ttl_slack_ms = 0
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
  ttl_slack_ms = 3600000
end

local function int(x)
  return string.format('%d', x)
end

-- A TTL in ms for state that counts for `us` more µs: never shorter, so never lost early.
local function ttl_ms(us)
  local q = math.floor(us / 1000)
  local r = us - q * 1000
  if r < 0 then
    q = q - 1
    r = r + 1000
  elseif r >= 1000 then
    q = q + 1
    r = r - 1000
  end
  if r > 0 then
    q = q + 1
  end
  return q + ttl_slack_ms
end

-- Keeps the ban index (ZSET: ban key -> end of ban in µs) to the bans that have not ended.
local function trim_ban_index(index)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', int(now))
  local last = redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', index, ttl_ms(tonumber(last[2]) - now))
  end
end

