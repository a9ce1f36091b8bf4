-- Gives back `cost` units to the rules of some limiters (a refund), never below empty; or, in
-- extend mode, renews a check's leases (its sliding-log entries move to now). All in one hash
-- slot (a Cluster store calls it once per slot). Mirrors the memory store's refund and renew
-- (crates/tollgate/src/memory/rules.rs), tollgate::Store::refund and Store::extend.
-- KEYS     per limiter, exactly LimiterRequest::state_keys: its sliding log first (if any
--          rule is one), then one key per fixed-window, GCRA or sliding-window rule
-- ARGV     1 now (see prelude.lua), 2 cost, 3 the check's id (its 8-byte nonce, the prefix
--          of its sliding-log members) or "" for none, 4 mode (0 refund, 1 extend: every
--          limiter's log must hold the check's `cost` members at its instant, still live, and
--          they all move to now; or nothing changes), then per limiter: rule count, its
--          longest sliding-log window µs (0: none), the instant µs the check recorded at
--          (-1: none, refund the newest units of the current window), then per rule:
--          algorithm (1 sliding_log, 2 fixed_window, 3 gcra, 4 sliding_window, 5 calendar
--          window), limit, window µs, and for a calendar window four instants µs around the
--          check's (as check.lua takes them)
-- Reply    refund: how many keys were changed; extend: {1, now} if renewed, {0, now} if a
--          lease is gone

local cost = tonumber(ARGV[2])
local id = ARGV[3]
local extend = ARGV[4] == '1'
local changed = 0
local keyi, argi = 0, 4

-- Sets `key` to `value`, keeping its TTL; one more key changed.
local function keep(key, value)
  keep_ttl(key, value)
  changed = changed + 1
end

local function arg()
  argi = argi + 1
  return tonumber(ARGV[argi])
end

if extend then
  -- Two passes over the limiters' logs: check every member, then move them all.
  local logs = {}
  while argi < #ARGV do
    local rules, longest, at = arg(), arg(), arg()
    if longest > 0 then
      keyi = keyi + 1
      logs[#logs + 1] = { KEYS[keyi], longest, at }
    end
    for _ = 1, rules do
      local algorithm = arg()
      arg()
      arg()
      if algorithm == 5 then
        argi = argi + 4
      end
      if algorithm ~= 1 then
        keyi = keyi + 1
      end
    end
  end
  for _, l in ipairs(logs) do
    local log, longest, at = l[1], l[2], l[3]
    -- A log shorter than the units cannot hold them all (and a caller's cost never makes this
    -- loop longer than the log).
    if at < 0 or at <= now - longest or redis.call('ZCARD', log) < cost then
      return { 0, now }
    end
    for u = 1, cost do
      local score = redis.call('ZSCORE', log, id .. int(u))
      if not score or tonumber(score) ~= at then
        return { 0, now }
      end
    end
  end
  local score = int(now)
  for _, l in ipairs(logs) do
    for u = 1, cost do
      redis.call('ZADD', l[1], 'XX', score, id .. int(u))
    end
    redis.call('PEXPIRE', l[1], int(ttl_ms(l[2])))
  end
  return { 1, now }
end

while argi < #ARGV do
  local rules, longest, at = arg(), arg(), arg()
  local when = now
  if at >= 0 then
    when = at
  end
  if longest > 0 then
    keyi = keyi + 1
    local log = KEYS[keyi]
    local removed = 0
    if at >= 0 and id ~= '' then
      -- The check's own members: id .. unit, scored with its instant; no more of them than
      -- the log holds, whatever cost the caller names.
      for u = 1, math.min(cost, redis.call('ZCARD', log)) do
        local member = id .. int(u)
        local score = redis.call('ZSCORE', log, member)
        if score and tonumber(score) == at then
          removed = removed + redis.call('ZREM', log, member)
        end
      end
    else
      removed = #redis.call('ZPOPMAX', log, int(cost))
    end
    if removed > 0 then
      changed = changed + 1
    end
  end
  for _ = 1, rules do
    local algorithm, limit, window = arg(), arg(), arg()
    local start
    if algorithm == 5 then
      -- The calendar window holding `when`: a fixed window from here on.
      local b = { arg(), arg(), arg(), arg() }
      algorithm = 2
      if when < b[2] then
        start = b[1]
      elseif when < b[3] then
        start = b[2]
      else
        start = b[3]
      end
    else
      local _, into = divmod(when, window)
      start = when - into
    end
    if algorithm ~= 1 then
      keyi = keyi + 1
      local key = KEYS[keyi]
      local value = redis.call('GET', key)
      if value and algorithm == 2 then
        local sep = string.find(value, ':', 1, true)
        if sep and tonumber(string.sub(value, 1, sep - 1)) == start then
          local count = tonumber(string.sub(value, sep + 1)) or 0
          keep(key, int(start) .. ':' .. int(math.max(0, count - cost)))
        end
      elseif value and algorithm == 3 then
        local tat = tonumber(value)
        if tat and tat > now then
          local interval = math.max(1, (divmod(window, limit)))
          local back = math.max(now, tat - interval * cost)
          if back > now then
            redis.call('SET', key, int(back), 'PX', ttl_ms(back - now))
          else
            redis.call('DEL', key)
          end
          changed = changed + 1
        end
      elseif value and algorithm == 4 then
        -- "start:previous:count": the check's window is the current one, or since ended, the
        -- previous.
        local s1 = string.find(value, ':', 1, true)
        local s2 = s1 and string.find(value, ':', s1 + 1, true)
        if s2 then
          local stored = tonumber(string.sub(value, 1, s1 - 1))
          local previous = tonumber(string.sub(value, s1 + 1, s2 - 1)) or 0
          local count = tonumber(string.sub(value, s2 + 1)) or 0
          if stored == start then
            count = math.max(0, count - cost)
          elseif stored == start + window then
            previous = math.max(0, previous - cost)
          end
          if stored == start or stored == start + window then
            keep(key, int(stored) .. ':' .. int(previous) .. ':' .. int(count))
          end
        end
      end
    end
  end
end
if keyi ~= #KEYS then
  return redis.error_reply('tollgate refund: ' .. #KEYS .. ' keys given, the limiters need ' .. keyi)
end
return changed
