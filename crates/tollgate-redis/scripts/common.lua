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

-- One page of an index: a sorted set of keys scored by when they end (µs; +inf: never), in
-- its order (by end, then by key), of the keys that end after now, after the cursor
-- (`after_end`, `after_key`: the last of the page before; nil for the first page), at most
-- `limit` (at least 1). Reply, flat: the next cursor (its end as text, 'inf' for never, and
-- its key), or '' and '' after the last page; now (µs, as text); then the keys.
--
-- O(log n + limit): the page starts at a rank found by ZCOUNT, so no call walks the keys
-- before it; only those that share the cursor's end are stepped over.
local function index_page(index, limit, after_end, after_key)
  local from = now
  if after_end and after_end > from then
    from = after_end
  end
  -- Every index entry before this rank ends before `from`.
  local rank
  if from == math.huge then
    rank = call('ZCOUNT', index, '-inf', '(+inf')
  else
    rank = call('ZCOUNT', index, '-inf', '(' .. format('%d', from))
  end
  local total = call('ZCARD', index)
  local out = { '', '', format('%d', now) }
  local found = 0
  local last_end, last_key
  while found < limit and rank < total do
    local batch = call('ZRANGE', index, rank, rank + limit - found - 1, 'WITHSCORES')
    if #batch == 0 then
      break
    end
    for i = 1, #batch, 2 do
      local key, ends = batch[i], math.huge
      if batch[i + 1] ~= 'inf' and batch[i + 1] ~= '+inf' then
        ends = tonumber(batch[i + 1])
      end
      rank = rank + 1
      local seen = after_end and ends == after_end and key <= after_key
      if ends > now and not seen then
        last_end, last_key = ends, key
        out[#out + 1] = key
        found = found + 1
      end
    end
  end
  if rank < total and last_end then
    if last_end == math.huge then
      out[1] = 'inf'
    else
      out[1] = format('%d', last_end)
    end
    out[2] = last_key
  end
  return out
end
