-- tollgate: the ban writer, one source spliced (`--@include ban_writer.lua`) into check.lua (a
-- denial on one server), offend.lua (a denial on a Cluster) and ban.lua (a ban by hand) when
-- the store builds its scripts. It mirrors tollgate::BanRule::duration_for and the memory
-- store's bans. Needs common.lua's `now`, `ttl_ms`, `call` and `format`.
--
-- A ban is a hash: u end of ban µs, s strikes, x end of the strike memory µs, k target kind,
-- v target value; it expires at x. The index (a ZSET of ban keys scored by u) lists the bans
-- that have not ended. `index` is false where the index lives in another hash slot (a
-- Cluster): the store then updates it with a call of its own (ban_index.lua).

-- Writes one ban, and its index entry if `index`.
local function put_ban(key, until_us, strikes, forget_at, kind, value, index)
  call('DEL', key)
  call('HSET', key, 'u', format('%d', until_us), 's', format('%d', strikes),
    'x', format('%d', forget_at), 'k', kind, 'v', value)
  call('PEXPIRE', key, format('%d', ttl_ms(forget_at - now)))
  if index then
    call('ZADD', index, format('%d', until_us), key)
  end
end

-- Keeps the index to the bans that have not ended, and its TTL to the last one's end.
local function trim_ban_index(index)
  call('ZREMRANGEBYSCORE', index, '-inf', format('%d', now))
  local last = call('ZRANGE', index, '-1', '-1', 'WITHSCORES')
  if last[2] then
    call('PEXPIRE', index, format('%d', ttl_ms(tonumber(last[2]) - now)))
  end
end

-- The ban for the `strike`-th offence, as tollgate::BanRule::duration_for.
local function ban_duration(duration, factor, cap, strike)
  if factor <= 1 then
    return math.min(duration, cap)
  end
  local d = duration
  for _ = 2, strike do
    d = d * factor
    if d >= cap then
      return cap
    end
  end
  return math.min(d, cap)
end

-- After a denial: bans every target for the longest ban of the denying limiters that ban.
-- `denying` is flat: duration µs, factor, cap µs per denying ban; `keys[b]` is the ban key of
-- the target `targets[2b - 1]` (kind), `targets[2b]` (value). Strikes count repeat offences
-- while remembered: until the ban ends plus the largest cap, when bans escalate. Returns the
-- longest ban written (µs) and each ban's end (µs).
local function ban_offender(denying, keys, targets, index)
  local memory = 0
  for d = 1, #denying, 3 do
    if denying[d + 1] > 1 and denying[d + 2] > memory then
      memory = denying[d + 2]
    end
  end
  local longest, ends = -1, {}
  for b, key in ipairs(keys) do
    -- A key without a target is only read (the blocklist every policy sees, beside a
    -- policy's own): no ban is written there.
    if targets[2 * b - 1] == '' then
      ends[b] = -1
    else
      local old = call('HMGET', key, 's', 'x')
      local strikes = 1
      if tonumber(old[2] or '') and tonumber(old[2]) > now then
        strikes = (tonumber(old[1] or '') or 0) + 1
      end
      local duration = 0
      for d = 1, #denying, 3 do
        duration = math.max(duration,
          ban_duration(denying[d], denying[d + 1], denying[d + 2], strikes))
      end
      local until_us = now + duration
      put_ban(key, until_us, strikes, until_us + memory, targets[2 * b - 1], targets[2 * b], index)
      ends[b] = until_us
      if duration > longest then
        longest = duration
      end
    end
  end
  if index then
    trim_ban_index(index)
  end
  return longest, ends
end
