-- tollgate: the head every script shares, spliced in (`--@include common.lua`) when the store
-- builds its scripts: check.lua, and the guard scripts through prelude.lua.
--
-- Lua numbers are doubles: integers below 2^53 (µs timestamps are ~1.8e15) are exact, but
-- a / b is not floor division and tostring() keeps only 14 digits, hence divmod() and
-- format('%d').

if redis.replicate_commands then
  -- Redis < 5 refuses writes after TIME unless the script replicates its effects.
  redis.replicate_commands()
end

local call, format = redis.call, string.format

-- The time (µs since the epoch) and the TTL slack (ms; an hour under a test clock, which may
-- stand still while real time, which PEXPIRE counts, goes on): set once by prelude.lua, or
-- per check by check.lua.
local now, ttl_slack_ms = 0, 0

local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
    r = r + b
  elseif r >= b then
    q = q + 1
    r = r - b
  end
  return q, r
end

-- A TTL in ms for state that counts for `us` more µs: never shorter, so never lost early.
local function ttl_ms(us)
  local q, r = divmod(us, 1000)
  if r > 0 then
    q = q + 1
  end
  return q + ttl_slack_ms
end

-- The limits an override sets (rule index -> limit; none where the configured limit stands),
-- from its stored value `o` (see override.lua: "fingerprint:ends:limit:...", then the
-- listing), for a limiter of `n` rules whose fingerprint is `fingerprint`; nil if it was made
-- for other rules or has ended.
local function override_limits_of(o, n, fingerprint)
  local v, c = {}, 0
  for d in string.gmatch(string.match(o, '^[^\n]*'), '%d+') do
    c = c + 1
    v[c] = tonumber(d)
  end
  if c ~= n + 2 or v[1] ~= fingerprint or (v[2] ~= 0 and v[2] <= now) then
    return nil
  end
  local limits = {}
  for j = 1, n do
    if v[j + 2] > 0 then
      limits[j] = v[j + 2]
    end
  end
  return limits
end
