-- The seed's sliding-log script, "Approach A" (shared/seeds/000_a986aaf936f3ff43.txt),
-- verbatim apart from these comments: the baseline tollgate's Redis store is measured against.
--
-- KEYS: 1 the limiter's ZSET, 2 a UUID (the new member), 3 the client's time in ms.
-- ARGV: (count, window ms) pairs, one per rule.
-- Reply: true (integer 1) = limited, false (nil) = admitted and recorded.

-- 1. Get parameters
local key = KEYS[1]
local uuid = KEYS[2]
local currentTime = tonumber(KEYS[3])
-- 2. Determine max TTL from rules
local expireTime = -1
-- 3. Iterate rules (ARGV = count, windowMs, count, windowMs, ...)
for i = 1, #ARGV, 2 do
  local rateRuleCount = tonumber(ARGV[i])
  local rateRuleTime = tonumber(ARGV[i + 1])
  -- 3.1 Count requests in window
  local count = redis.call('ZCOUNT', key, currentTime - rateRuleTime, currentTime)
  -- 3.2 If any rule exceeded, reject
  if tonumber(count) >= rateRuleCount then
    return true
  end
  -- 3.3 Track max window for TTL
  if rateRuleTime > expireTime then
    expireTime = rateRuleTime
  end
end
-- 4. Add current request
redis.call('ZADD', key, currentTime, uuid)
-- 5. Set expiry to max window (ms)
redis.call('PEXPIRE', key, expireTime)
-- 6. Remove expired entries
redis.call('ZREMRANGEBYSCORE', key, 0, currentTime - expireTime)
return false
