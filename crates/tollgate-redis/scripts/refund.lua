-- Gives back `cost` units to the rules of some limiters (a refund), never below empty; in
-- extend mode, renews a check's leases (its sliding-log entries move to now); in charge mode,
-- adds `cost` units whatever the limits say (a settlement's debt). All in one hash
-- slot (a Cluster store calls it once per slot). Mirrors the memory store's refund and renew
-- (crates/tollgate/src/memory/rules.rs), tollgate::Store::refund and Store::extend.
-- KEYS     per limiter: its override key if it takes overrides (see check.lua), then exactly
--          LimiterRequest::state_keys: its sliding log first (if any rule is one), then one
--          key per fixed-window, GCRA or sliding-window rule; last, on a Cluster, this call's
--          marker (tollgate::applied_key; see once() in prelude.lua: a second run changes
--          nothing)
-- ARGV     1 now (see prelude.lua), 2 cost, 3 the check's id (its 8-byte nonce, the prefix
--          of its sliding-log members) or "" for none, 4 mode (0 refund, 1 extend: every
--          limiter's log must hold the check's members (all a partial refund left, at least
--          one, whatever `cost` says), still live, wherever an earlier renewal put them, and
--          they all move to now; or nothing changes; 2 charge: ARGV[3]
--          is a fresh nonce for the log's members), 5 how long the marker lasts, ms (0: no marker), then per
--          limiter: rule count, its longest sliding-log window µs (0: none), the instant µs
--          the check recorded at (-1: none, refund the newest units of the current window;
--          charge: the most entries its log may hold, twice its largest sliding-log limit),
--          the fingerprint of its rules if it takes overrides (0: it does
--          not; a live override made for them sets the limits GCRA's interval follows), then
--          per rule:
--          algorithm (1 sliding_log, 2 fixed_window, 3 gcra, 4 sliding_window, 5 calendar
--          window), limit, window µs, the limit the check counted by (a refund by a receipt:
--          it gives back by the larger of it and the limit in force; 0: none), and for a
--          calendar window four instants µs around the check's (as check.lua takes them)
-- Reply    refund and charge: how many keys were changed; extend: {1, now} if renewed,
--          {0, now} if a lease is gone

return once(tonumber(ARGV[5]), function()
  local cost = tonumber(ARGV[2])
  local id = ARGV[3]
  local extend = ARGV[4] == '1'
  local charge = ARGV[4] == '2'
  local changed = 0
  local keyi, argi = 0, 5

  -- Sets `key` to `value`, keeping its TTL; one more key changed.
  local function keep(key, value)
    keep_ttl(key, value)
    changed = changed + 1
  end

  local function arg()
    argi = argi + 1
    return tonumber(ARGV[argi])
  end

  -- How many of the check's members `log` holds. They are id .. 1 up to id .. m without a gap
  -- (a check writes them so, and a refund takes the highest first), and a check writes at most
  -- tollgate::MAX_LOG_COST of them, so halving finds m in a few look-ups.
  local function members(log)
    local lo, hi = 0, 1000
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      if redis.call('ZSCORE', log, id .. int(mid)) then
        lo = mid
      else
        hi = mid - 1
      end
    end
    return lo
  end

  -- The limits of a limiter's override (rule index -> limit; none where the configured limit
  -- stands), when it takes overrides (`fingerprint` > 0): its key is the limiter's next.
  local function override_limits(fingerprint, n)
    if fingerprint == 0 then
      return {}
    end
    keyi = keyi + 1
    local o = redis.call('GET', KEYS[keyi])
    return o and override_limits_of(o, n, fingerprint) or {}
  end

  if extend then
    -- Two passes over the limiters' logs: check every member, then move them all.
    local logs = {}
    while argi < #ARGV do
      local rules, longest, at = arg(), arg(), arg()
      if arg() > 0 then
        keyi = keyi + 1 -- a lease's units do not depend on a limit
      end
      if longest > 0 then
        keyi = keyi + 1
        logs[#logs + 1] = { KEYS[keyi], longest, at }
      end
      for _ = 1, rules do
        local algorithm = arg()
        argi = argi + 3
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
      if at < 0 then
        return { 0, now }
      end
      -- The check's members, wherever a renewal moved them (the receipt may be from before
      -- it: a renewal whose answer was lost is asked again): all a partial refund left,
      -- whatever units the receipt names, at least one, still counting. They share one score.
      local held = members(log)
      local score = held > 0 and redis.call('ZSCORE', log, id .. '1')
      if not score or tonumber(score) <= now - longest then
        return { 0, now }
      end
      l[4] = held
    end
    local score = int(now)
    for _, l in ipairs(logs) do
      for u = 1, l[4] do
        redis.call('ZADD', l[1], 'XX', score, id .. int(u))
      end
      redis.call('PEXPIRE', l[1], int(ttl_ms(l[2])))
    end
    return { 1, now }
  end

  if charge then
    -- Mirrors the memory store's RuleStates::charge.
    local year = 366 * 86400000000
    while argi < #ARGV do
      local rules, longest, cap = arg(), arg(), arg()
      local limits = override_limits(arg(), rules)
      -- The rules first: the limits an override sets bound the log too (twice the largest
      -- sliding-log limit).
      local list = {}
      local overridden = next(limits) ~= nil
      if overridden then
        cap = 0
      end
      for r = 1, rules do
        local algorithm, limit, window = arg(), arg(), arg()
        argi = argi + 1 -- a charge counts by the limits in force
        limit = limits[r] or limit
        local bounds = false
        if algorithm == 5 then
          bounds = { arg(), arg(), arg(), arg() }
        end
        if overridden and algorithm == 1 then
          cap = math.max(cap, 2 * limit)
        end
        list[r] = { algorithm, limit, window, bounds }
      end
      if longest > 0 then
        keyi = keyi + 1
        local log = KEYS[keyi]
        if now >= longest then
          redis.call('ZREMRANGEBYSCORE', log, '-inf', int(now - longest))
        end
        local units = math.min(cost, math.max(0, cap - redis.call('ZCARD', log)))
        local score = int(now)
        local unit = 1
        while unit <= units do
          local upto = math.min(units, unit + 499)
          local args = {}
          for u = unit, upto do
            args[#args + 1] = score
            args[#args + 1] = id .. 'd' .. int(u)
          end
          redis.call('ZADD', log, unpack(args))
          unit = upto + 1
        end
        redis.call('PEXPIRE', log, int(ttl_ms(longest)))
        changed = changed + 1
      end
      for r = 1, rules do
        local algorithm, limit, window, b = list[r][1], list[r][2], list[r][3], list[r][4]
        local twice = 2 * limit
        if algorithm ~= 1 then
          keyi = keyi + 1
          local key = KEYS[keyi]
          local value = redis.call('GET', key)
          if algorithm == 2 or algorithm == 5 then
            local start, finish
            if algorithm == 5 then
              -- The calendar window holding now, among the three given.
              if now < b[2] then
                start, finish = b[1], b[2]
              elseif now < b[3] then
                start, finish = b[2], b[3]
              else
                start, finish = b[3], b[4]
              end
            else
              local _, into = divmod(now, window)
              start = now - into
              finish = start + window
            end
            local count = 0
            local sep = value and string.find(value, ':', 1, true)
            if sep and tonumber(string.sub(value, 1, sep - 1)) == start then
              count = tonumber(string.sub(value, sep + 1)) or 0
            end
            redis.call('SET', key, int(start) .. ':' .. int(math.min(count + cost, twice)),
              'PX', int(ttl_ms(finish - now)))
          elseif algorithm == 3 then
            local tat = (value and tonumber(value)) or now
            if tat < now then
              tat = now
            end
            local interval = math.max(1, (divmod(window, limit)))
            tat = math.min(tat + interval * cost, now + year)
            redis.call('SET', key, int(tat), 'PX', int(ttl_ms(tat - now)))
          elseif algorithm == 4 then
            local _, into = divmod(now, window)
            local start = now - into
            local previous, count = 0, 0
            local s1 = value and string.find(value, ':', 1, true)
            local s2 = s1 and string.find(value, ':', s1 + 1, true)
            if s2 then
              local stored = tonumber(string.sub(value, 1, s1 - 1))
              local n = tonumber(string.sub(value, s2 + 1)) or 0
              if stored == start then
                previous, count = tonumber(string.sub(value, s1 + 1, s2 - 1)) or 0, n
              elseif stored == start - window then
                previous = n
              end
            end
            redis.call('SET', key,
              int(start) .. ':' .. int(previous) .. ':' .. int(math.min(count + cost, twice)),
              'PX', int(ttl_ms(start + 2 * window - now)))
          end
          changed = changed + 1
        end
      end
    end
    if keyi ~= #KEYS then
      return redis.error_reply('tollgate charge: ' .. #KEYS .. ' keys given, the limiters need ' .. keyi)
    end
    return changed
  end

  while argi < #ARGV do
    local rules, longest, at = arg(), arg(), arg()
    local limits = override_limits(arg(), rules)
    local when = now
    if at >= 0 then
      when = at
    end
    if longest > 0 then
      keyi = keyi + 1
      local log = KEYS[keyi]
      local removed = 0
      if at >= 0 and id ~= '' then
        -- The check's own members, wherever a lease's renewal moved them: the highest
        -- first, so that what a partial refund leaves is id .. 1 on (see members()).
        local held = members(log)
        for u = held, held - math.min(cost, held) + 1, -1 do
          removed = removed + redis.call('ZREM', log, id .. int(u))
        end
        -- A check a Cluster client sent again (its reply lost) and Redis ran twice recorded
        -- its units again under the same nonce, as id .. 'r' .. k (see check.lua): they are
        -- this check's too, never an admission, and go with it (a lease's would otherwise
        -- hold a second slot until its TTL).
        local k = 1
        while k <= 1000 and redis.call('ZREM', log, id .. 'r' .. int(k)) == 1 do
          removed = removed + 1
          k = k + 1
        end
      else
        removed = #redis.call('ZPOPMAX', log, int(cost))
      end
      if removed > 0 then
        changed = changed + 1
      end
    end
    for r = 1, rules do
      local algorithm, limit, window, counted = arg(), arg(), arg(), arg()
      -- By a receipt, the limit the check counted by, unless the one in force now is higher:
      -- GCRA gives back no more time than the check took, whatever limit the receipt names.
      limit = math.max(limits[r] or limit, counted)
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
end)
