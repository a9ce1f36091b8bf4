-- Repair after a failover: writes again, in one key, what this instance's own recent
-- admissions wrote there, so that a promoted replica that never received them counts them.
-- Every op is idempotent: a key that still holds the writes (or has gone past them) is left
-- as it is, and running the repair twice changes nothing the second time.
-- KEYS     one state key
-- ARGV     1 now (see prelude.lua), 2 op, then:
--          op 1 sliding log: deadline µs (when the log's longest window has passed the
--          newest member), n, then n times: nonce (8 bytes), score (the check's now), cost,
--          retried members; each member is added if missing (ZADD NX: the members are named
--          by the check's nonce, so one already there is that very admission)
--          op 2 fixed window: window start, count written, deadline µs (the window's end):
--          the count is raised to the one written, in that window only
--          op 3 gcra: tat written, deadline µs: the tat is raised to the one written
--          op 4 sliding window: window start (plus 1 if the previous window counted), count
--          written, deadline µs (the end of the next window): as op 2, and a key still in
--          the window before keeps its count as this window's previous one
-- Reply    1 if the key changed, else 0

local key = KEYS[1]
local op = tonumber(ARGV[2])

-- The state's TTL for a deadline; 0 once it has passed (nothing left to repair).
local function ttl(deadline)
  if deadline <= now then
    return 0
  end
  return ttl_ms(deadline - now)
end

if op == 1 then
  local left = ttl(tonumber(ARGV[3]))
  if left == 0 then
    return 0
  end
  local added = 0
  local n = tonumber(ARGV[4])
  for i = 0, n - 1 do
    local at = 5 + 4 * i
    local nonce, score = ARGV[at], ARGV[at + 1]
    local cost, retried = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    for u = 1, cost do
      added = added + redis.call('ZADD', key, 'NX', score, nonce .. int(u))
    end
    for r = 1, retried do
      added = added + redis.call('ZADD', key, 'NX', score, nonce .. 'r' .. int(r))
    end
  end
  if added == 0 then
    return 0
  end
  if redis.call('PTTL', key) < left then
    redis.call('PEXPIRE', key, left)
  end
  return 1
end

local a, b, deadline = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local left = ttl(deadline)
if left == 0 then
  return 0
end
local value = redis.call('GET', key)

if op == 3 then
  if tonumber(value or '') and tonumber(value) >= a then
    return 0
  end
  redis.call('SET', key, int(a), 'PX', left)
  return 1
elseif op == 2 then
  if value then
    local sep = string.find(value, ':', 1, true)
    local start = sep and tonumber(string.sub(value, 1, sep - 1))
    local count = sep and tonumber(string.sub(value, sep + 1)) or 0
    -- A later window: the written one is over. The same window, counted as high: done.
    if start and (start > a or (start == a and count >= b)) then
      return 0
    end
  end
  redis.call('SET', key, int(a) .. ':' .. int(b), 'PX', left)
  return 1
elseif op == 4 then
  local start = a - a % 1000
  local window = (deadline - start) / 2
  local previous = '0'
  if value then
    local s1 = string.find(value, ':', 1, true)
    local s2 = s1 and string.find(value, ':', s1 + 1, true)
    if s2 then
      local stored = tonumber(string.sub(value, 1, s1 - 1))
      local count = tonumber(string.sub(value, s2 + 1)) or 0
      if stored and (stored > start or (stored == start and count >= b)) then
        return 0
      end
      if stored == start then
        previous = string.sub(value, s1 + 1, s2 - 1)
      elseif stored == start - window then
        previous = int(count)
      end
    end
  end
  redis.call('SET', key, int(start) .. ':' .. previous .. ':' .. int(b), 'PX', left)
  return 1
end
return redis.error_reply('tollgate redo: unknown op ' .. tostring(op))
