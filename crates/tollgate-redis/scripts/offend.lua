-- Cluster: bans the offender after a denial by limiters that ban, as check.lua does on a
-- standalone server (same strikes, same escalation, same index).
-- KEYS     the ban keys (see ban.lua), then the ban index (see prelude.lua)
-- ARGV     1 now (see prelude.lua), 2 number of denying bans, then per ban: duration µs,
--          factor, cap µs; then per ban key: target kind, target value
-- Reply    the longest ban written, in µs

local denying = {}
local argi = 2
for _ = 1, tonumber(ARGV[2]) do
  denying[#denying + 1] = {
    duration = tonumber(ARGV[argi + 1]),
    factor = tonumber(ARGV[argi + 2]),
    cap = tonumber(ARGV[argi + 3]),
  }
  argi = argi + 3
end
local index = KEYS[#KEYS]

-- The ban for the `strike`-th offence, as tollgate::BanRule::duration_for.
local function ban_duration(ban, strike)
  if ban.factor <= 1 then
    return math.min(ban.duration, ban.cap)
  end
  local d = ban.duration
  for _ = 2, strike do
    d = d * ban.factor
    if d >= ban.cap then
      return ban.cap
    end
  end
  return math.min(d, ban.cap)
end

-- Strikes are remembered until the ban ends plus the cap, when bans escalate.
local memory = 0
for _, ban in ipairs(denying) do
  if ban.factor > 1 and ban.cap > memory then
    memory = ban.cap
  end
end
local longest = -1
for i = 1, #KEYS - 1 do
  local key = KEYS[i]
  local kind, value = ARGV[argi + 1], ARGV[argi + 2]
  argi = argi + 2
  local old = redis.call('HMGET', key, 's', 'x')
  local strikes = 1
  if tonumber(old[2] or '') and tonumber(old[2]) > now then
    strikes = (tonumber(old[1] or '') or 0) + 1
  end
  local duration = 0
  for _, ban in ipairs(denying) do
    duration = math.max(duration, ban_duration(ban, strikes))
  end
  local until_us = now + duration
  redis.call('DEL', key)
  redis.call('HSET', key, 'u', int(until_us), 's', int(strikes), 'x', int(until_us + memory),
    'k', kind, 'v', value)
  redis.call('PEXPIRE', key, ttl_ms(until_us + memory - now))
  redis.call('ZADD', index, int(until_us), key)
  if duration > longest then
    longest = duration
  end
end
trim_ban_index(index)
return longest
