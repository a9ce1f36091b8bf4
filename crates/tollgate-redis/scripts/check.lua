-- tollgate: one atomic check of every rule of every limiter of a plan.
-- Mirrors tollgate::algorithm (crates/tollgate/src/algorithm.rs) number for number.
--
-- KEYS:
--   per limiter in plan order, exactly PlanLimiter::state_keys: the limiter's sliding log
--   (ZSET, score = µs timestamp) first, if any rule is a sliding log; then one key per
--   fixed-window rule (string "start:count") or GCRA rule (string tat), in rule order;
--   then the plan's ban keys (hashes, see ban.lua), then the ban index (if any ban key).
-- ARGV:
--   1  cost      units this request consumes
--   2  consume   1 = record the admission, 0 = only compute the decision (peek)
--   3  now       µs since the epoch, or "" to read the server's TIME (production: one clock).
--                A test clock's time; keys then get an hour more TTL, because that clock may
--                stand still while real time, which PEXPIRE counts, goes on.
--   4  nonce     random bytes, fresh per call; sliding-log members are nonce .. unit index
--   5  limiters  number of limiters; then per limiter:
--        rule count, bans (1 = the limiter bans offenders, 0 = it does not), ban duration µs,
--        ban factor, ban cap µs;
--        then per rule: algorithm (1 sliding_log, 2 fixed_window, 3 gcra), limit, window µs
--   then  bans   number of ban keys; then per ban key: target kind, target value
--   then  report (optional, Cluster stores only; absent or 0 on a standalone call):
--                1 = append what this call recorded, so that the store can undo the
--                reservation (undo.lua) when another hash slot denies; 2 = also append each
--                rule's outcome at cost 0, the state as it stays once undone
-- Reply: a flat array of integers:
--   allowed (1/0), blocked_us (-1 = not banned), banned_us (-1 = this check banned nobody),
--   then, unless blocked, per rule (limiters in order, rules in order):
--   allowed (1/0), remaining, reset_after_us, retry_after_us (-1 = none)
--   then, if report > 0: recorded (1/0); if recorded: now (the sliding-log score), then per
--   rule two integers: sliding log: retried members of its log (see the ZADD below), µs
--   until the newest entry before this one leaves (0: none); fixed window: window start,
--   count written; gcra: tat before (at least now), tat written (enough for the store to
--   work out each rule's outcome at cost 0 itself);
--   then, if report = 2, every rule admitted and nothing was recorded (a peek, or cost 0),
--   per rule the four integers of its outcome at cost 0
--
-- Lua numbers are doubles: integers below 2^53 (µs timestamps are ~1.8e15) are exact, but
-- a / b is not floor division and tostring() keeps only 14 digits, hence divmod() and int().

if redis.replicate_commands then
  -- Redis < 5 refuses writes after TIME unless the script replicates its effects.
  redis.replicate_commands()
end

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

local function int(x)
  return string.format('%d', x)
end

local ttl_slack_ms = 0
if ARGV[3] ~= '' then
  ttl_slack_ms = 3600000
end

-- A TTL in ms for state that counts for `us` more µs: never shorter, so never lost early.
local function ttl_ms(us)
  local q, r = divmod(us, 1000)
  if r > 0 then
    q = q + 1
  end
  return q + ttl_slack_ms
end

local SLIDING_LOG, FIXED_WINDOW, GCRA = 1, 2, 3

local cost = tonumber(ARGV[1])
local consume = ARGV[2] == '1'
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
end
local nonce = ARGV[4]

-- The plan: rules in reply order, each with its key; limiters with their log key.
local argi, keyi = 4, 0
local function next_arg()
  argi = argi + 1
  return ARGV[argi]
end
local function next_number()
  return tonumber(next_arg())
end
local function next_key()
  keyi = keyi + 1
  return KEYS[keyi]
end

local rules = {}
local logs = {}
local limiters = {}
for _ = 1, next_number() do
  local first = #rules + 1
  local n = next_number()
  local ban
  if next_arg() == '1' then
    ban = { duration = next_number(), factor = next_number(), cap = next_number() }
  else
    next_arg()
    next_arg()
    next_arg()
  end
  limiters[#limiters + 1] = { first = first, last = first + n - 1, ban = ban }
  local log_window = 0
  for _ = 1, n do
    local rule = { kind = next_number(), limit = next_number(), window = next_number() }
    if rule.kind == SLIDING_LOG and rule.window > log_window then
      log_window = rule.window
    end
    rules[#rules + 1] = rule
  end
  local log
  if log_window > 0 then
    log = { key = next_key(), window = log_window, retries = 0 }
    logs[#logs + 1] = log
  end
  for i = first, #rules do
    if rules[i].kind == SLIDING_LOG then
      rules[i].key = log.key
      rules[i].log = log
    else
      rules[i].key = next_key()
    end
  end
end
local bans = {}
for _ = 1, next_number() do
  bans[#bans + 1] = { key = next_key(), kind = next_arg(), value = next_arg() }
end
local ban_index
if #bans > 0 then
  ban_index = next_key()
end
local report = tonumber(next_arg() or '0') or 0
if keyi ~= #KEYS then
  return redis.error_reply('tollgate check: ' .. #KEYS .. ' keys given, the plan needs ' .. keyi)
end

-- A live ban blocks before any rule is looked at.
local blocked = -1
for _, b in ipairs(bans) do
  local until_us = tonumber(redis.call('HGET', b.key, 'u') or '')
  if until_us and until_us > now and until_us - now > blocked then
    blocked = until_us - now
  end
end
if blocked >= 0 then
  return { 0, blocked, -1 }
end

-- Each evaluator returns {allowed, remaining, reset_after, retry_after} and, when it admits,
-- what to write.

local function sliding_log(rule, c)
  local window, limit = rule.window, rule.limit
  -- Live entries are t > now - window (all of them while now < window).
  local edge = '-inf'
  if now >= window then
    edge = '(' .. int(now - window)
  end
  local count = redis.call('ZCOUNT', rule.key, edge, '+inf')
  local newest = 0
  if count > 0 then
    local last = redis.call('ZRANGE', rule.key, -1, -1, 'WITHSCORES')
    newest = tonumber(last[2]) + window - now
  end
  if count + c <= limit then
    local reset = newest
    if c > 0 then
      reset = window
    end
    return { 1, limit - count - c, reset, -1 }, { newest = newest }
  end
  -- The request fits once the (count + c - limit) oldest live entries have left.
  local must_leave = count + c - limit
  local retry = -1
  if must_leave <= count then
    local entry = redis.call('ZRANGEBYSCORE', rule.key, edge, '+inf', 'WITHSCORES', 'LIMIT', must_leave - 1, 1)
    retry = tonumber(entry[2]) + window - now
  end
  return { 0, limit - math.min(count, limit), newest, retry }
end

local function fixed_window(rule, c)
  local window, limit = rule.window, rule.limit
  local _, into = divmod(now, window)
  local start = now - into
  local count = 0
  local value = redis.call('GET', rule.key)
  if value then
    local sep = string.find(value, ':', 1, true)
    if sep and tonumber(string.sub(value, 1, sep - 1)) == start then
      count = tonumber(string.sub(value, sep + 1)) or 0
    end
  end
  local reset = start + window - now
  if count + c <= limit then
    local shown = reset
    if count + c == 0 then
      shown = 0
    end
    return { 1, limit - count - c, shown, -1 }, { start = start, count = count + c }
  end
  return { 0, limit - math.min(count, limit), reset, reset }
end

local function gcra(rule, c)
  local limit = rule.limit
  local interval = math.max(1, (divmod(rule.window, limit)))
  local capacity = interval * limit
  local value = redis.call('GET', rule.key)
  local tat = (value and tonumber(value)) or now
  if tat < now then
    tat = now
  end
  local new_tat = tat + interval * c
  if new_tat - now <= capacity then
    return { 1, (divmod(capacity - (new_tat - now), interval)), new_tat - now, -1 },
      { old = tat, new = new_tat }
  end
  local remaining = 0
  if capacity > tat - now then
    remaining = divmod(capacity - (tat - now), interval)
  end
  return { 0, remaining, tat - now, new_tat - capacity - now }
end

local evaluators = { [SLIDING_LOG] = sliding_log, [FIXED_WINDOW] = fixed_window, [GCRA] = gcra }

local function evaluate(rule, c)
  local evaluator = evaluators[rule.kind]
  if not evaluator then
    error('tollgate check: unknown algorithm code ' .. tostring(rule.kind))
  end
  return evaluator(rule, c)
end

local outcomes, writes = {}, {}
local allowed = true
for i, rule in ipairs(rules) do
  outcomes[i], writes[i] = evaluate(rule, cost)
  if outcomes[i][1] == 0 then
    allowed = false
  end
end

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

-- After a denial: ban every target for the longest ban of the denying limiters that ban.
local function ban_offender()
  local denying = {}
  for _, limiter in ipairs(limiters) do
    if limiter.ban then
      for i = limiter.first, limiter.last do
        if outcomes[i][1] == 0 then
          denying[#denying + 1] = limiter.ban
          break
        end
      end
    end
  end
  if #denying == 0 then
    return -1
  end
  -- Strikes are remembered until the ban ends plus the cap, when bans escalate.
  local memory = 0
  for _, ban in ipairs(denying) do
    if ban.factor > 1 and ban.cap > memory then
      memory = ban.cap
    end
  end
  local longest = -1
  for _, b in ipairs(bans) do
    local old = redis.call('HMGET', b.key, 's', 'x')
    local strikes = 1
    if tonumber(old[2] or '') and tonumber(old[2]) > now then
      strikes = (tonumber(old[1] or '') or 0) + 1
    end
    local duration = 0
    for _, ban in ipairs(denying) do
      duration = math.max(duration, ban_duration(ban, strikes))
    end
    local until_us = now + duration
    redis.call('DEL', b.key)
    redis.call('HSET', b.key, 'u', int(until_us), 's', int(strikes), 'x', int(until_us + memory),
      'k', b.kind, 'v', b.value)
    redis.call('PEXPIRE', b.key, ttl_ms(until_us + memory - now))
    redis.call('ZADD', ban_index, int(until_us), b.key)
    if duration > longest then
      longest = duration
    end
  end
  redis.call('ZREMRANGEBYSCORE', ban_index, '-inf', int(now))
  local last = redis.call('ZRANGE', ban_index, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', ban_index, ttl_ms(tonumber(last[2]) - now))
  end
  return longest
end

local banned = -1
local recorded = false
-- Cluster stores: how each rule stays if another slot denies. (When this call records, the
-- store works that out from the record instead.)
local zero = {}
if allowed and report >= 2 and not (consume and cost > 0) then
  for i, rule in ipairs(rules) do
    zero[i] = evaluate(rule, 0)
  end
end
if not allowed then
  -- Nothing is recorded: rules that would have admitted report the state as it stays.
  for i, rule in ipairs(rules) do
    if outcomes[i][1] == 1 then
      outcomes[i] = evaluate(rule, 0)
    end
  end
  if consume and #bans > 0 then
    banned = ban_offender()
  end
elseif consume and cost > 0 then
  recorded = true
  for _, log in ipairs(logs) do
    if now >= log.window then
      redis.call('ZREMRANGEBYSCORE', log.key, '-inf', int(now - log.window))
    end
    -- ZADD NX reports what it added: a member that already exists (a nonce collision) would
    -- otherwise silently count once for two units.
    local score = int(now)
    local missing = 0
    local unit = 1
    while unit <= cost do
      local last = math.min(cost, unit + 499)
      local args = {}
      for u = unit, last do
        args[#args + 1] = score
        args[#args + 1] = nonce .. int(u)
      end
      missing = missing + (last - unit + 1) - redis.call('ZADD', log.key, 'NX', unpack(args))
      unit = last + 1
    end
    local attempt = 0
    while missing > 0 do
      attempt = attempt + 1
      if attempt > 1000 then
        error('tollgate check: cannot find a free sliding-log member')
      end
      missing = missing - redis.call('ZADD', log.key, 'NX', score, nonce .. 'r' .. int(attempt))
    end
    log.retries = attempt
    redis.call('PEXPIRE', log.key, ttl_ms(log.window))
  end
  for i, rule in ipairs(rules) do
    local write = writes[i]
    if rule.kind == FIXED_WINDOW then
      local ttl = ttl_ms(write.start + rule.window - now)
      redis.call('SET', rule.key, int(write.start) .. ':' .. int(write.count), 'PX', ttl)
    elseif rule.kind == GCRA then
      redis.call('SET', rule.key, int(write.new), 'PX', ttl_ms(write.new - now))
    end
  end
end

local reply = { allowed and 1 or 0, -1, banned }
for _, outcome in ipairs(outcomes) do
  for j = 1, 4 do
    reply[#reply + 1] = outcome[j]
  end
end
if report > 0 then
  reply[#reply + 1] = recorded and 1 or 0
end
if recorded and report > 0 then
  reply[#reply + 1] = now
  for i, rule in ipairs(rules) do
    local write = writes[i]
    if rule.kind == SLIDING_LOG then
      reply[#reply + 1] = rule.log.retries
      reply[#reply + 1] = write.newest
    elseif rule.kind == FIXED_WINDOW then
      reply[#reply + 1] = write.start
      reply[#reply + 1] = write.count
    else
      reply[#reply + 1] = write.old
      reply[#reply + 1] = write.new
    end
  end
end
for _, outcome in ipairs(zero) do
  for j = 1, 4 do
    reply[#reply + 1] = outcome[j]
  end
end
return reply
