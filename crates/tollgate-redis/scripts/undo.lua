-- Cluster: undoes the reservation a check.lua call made in one hash slot, after another slot
-- denied the same check (or the identity turned out to be banned), so that a denied request
-- costs nothing. Each undo only removes what that call wrote; state someone else has built on
-- since stays (at worst one more denial, never one more admission).
-- KEYS     the state keys to undo, all in one slot, each once; last, this call's marker
--          (tollgate::applied_key; see once() in prelude.lua: a second run changes nothing)
-- ARGV     1 now (see prelude.lua), 2 cost, 3 nonce (the check's), 4 how long the marker
--          lasts, ms, then per key:
--          op, a, b, with op = 1 sliding log: a = the check's now (the members' score),
--          b = retried members; op = 2 fixed window: a = window start; op = 4 sliding
--          window: a = window start (plus 1 if the previous window counted); op = 3 gcra:
--          a = tat before, b = tat written
-- Reply    how many keys were changed

return once(tonumber(ARGV[4]), function()
  local cost = tonumber(ARGV[2])
  local nonce = ARGV[3]
  local changed = 0

  -- Removes `member` if it still has the score the check gave it: a member of the same name
  -- and another score is not ours.
  local function remove(key, member, score)
    local current = redis.call('ZSCORE', key, member)
    if current and tonumber(current) == score then
      return redis.call('ZREM', key, member)
    end
    return 0
  end

  for i, key in ipairs(KEYS) do
    local op = tonumber(ARGV[5 + (i - 1) * 3])
    local a = tonumber(ARGV[6 + (i - 1) * 3])
    local b = tonumber(ARGV[7 + (i - 1) * 3])
    if op == 1 then
      local removed = 0
      for u = 1, cost do
        removed = removed + remove(key, nonce .. int(u), a)
      end
      for r = 1, b do
        removed = removed + remove(key, nonce .. 'r' .. int(r), a)
      end
      if removed > 0 then
        changed = changed + 1
      end
    elseif op == 2 then
      local value = redis.call('GET', key)
      if value then
        local sep = string.find(value, ':', 1, true)
        if sep and tonumber(string.sub(value, 1, sep - 1)) == a then
          local count = tonumber(string.sub(value, sep + 1)) or 0
          keep_ttl(key, int(a) .. ':' .. int(math.max(0, count - cost)))
          changed = changed + 1
        end
      end
    elseif op == 3 then
      local value = tonumber(redis.call('GET', key) or '')
      -- Only while it is still the value the check wrote: a later check built on it.
      if value == b then
        if a > now then
          redis.call('SET', key, int(a), 'PX', ttl_ms(a - now))
        else
          redis.call('DEL', key)
        end
        changed = changed + 1
      end
    elseif op == 4 then
      local value = redis.call('GET', key)
      local start = a - a % 1000
      if value then
        local s1 = string.find(value, ':', 1, true)
        local s2 = s1 and string.find(value, ':', s1 + 1, true)
        if s2 and tonumber(string.sub(value, 1, s1 - 1)) == start then
          local previous = string.sub(value, s1 + 1, s2 - 1)
          local count = tonumber(string.sub(value, s2 + 1)) or 0
          keep_ttl(key, int(start) .. ':' .. previous .. ':' .. int(math.max(0, count - cost)))
          changed = changed + 1
        end
      end
    else
      return redis.error_reply('tollgate undo: unknown op ' .. tostring(op))
    end
  end
  return changed
end)
