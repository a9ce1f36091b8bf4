-- tollgate: atomic checks of every rule of every limiter of a plan; one call runs one check or
-- a batch of them, one after the other, against one TIME.
-- Mirrors tollgate::algorithm (crates/tollgate/src/algorithm.rs) number for number.
--
-- A call holds N >= 1 checks. Each is all-or-nothing on its own and sees what the checks
-- before it in the call recorded: the same answers as N calls one after the other.
--
-- KEYS: per check, in call order:
--   per limiter in plan order: if the limiter takes overrides, its override key (string
--   "fingerprint:ends µs (0: never):limit:limit:...", a limit per rule, 0 where the configured
--   one stands, then a newline and what only a listing reads); then exactly
--   LimiterRequest::state_keys: the limiter's sliding log (ZSET, score = µs timestamp) first,
--   if any rule is a sliding log; then one key per fixed-window rule (string "start:count"),
--   GCRA rule (string tat) or sliding-window rule (string "start:previous:count"), in rule
--   order;
--   then the plan's ban keys (hashes, see ban_writer.lua), then the ban index if this check
--   may write a ban (see "writes bans" below; a Cluster store never sends such a check here,
--   its ban keys and the index live in other slots: it uses offend.lua and ban_index.lua).
-- ARGV: per check, in call order:
--   the plan: 8 random bytes, the nonce (fresh per check; sliding-log members are nonce ..
--   unit index), then little-endian signed 64-bit integers, all read by one struct.unpack
--   (a tonumber() per number, and Redis's own cost per argument, would cost more than the
--   commands of a check):
--     now       µs since the epoch, or -1 to read the server's TIME (production: one clock,
--               read once per call). A test clock's time; keys then get an hour more TTL,
--               because that clock may stand still while real time, which PEXPIRE counts,
--               goes on.
--     cost      units this request consumes
--     consume   bit 0: 1 = record the admission, 0 = only compute the decision (peek); the
--               rest (the value over 2): how long the request may wait, µs (GCRA rules admit
--               units that conform within it, reserving their place; 0: none)
--     limiters  number of limiters; then per limiter:
--       rule count, its longest sliding-log window µs (0 = no sliding-log rule),
--       bans (1 = the limiter bans offenders, then ban duration µs, ban factor, ban cap µs;
--       0 = it does not, and nothing follows; 2 = the limiter is shadow, a dry run: it bans
--       nobody and takes no part in `allowed`, and an admitted check records nothing in it
--       when it would deny; plus 4 if the limiter takes overrides: the fingerprint of its
--       rules follows (after the ban's three), and an override made for it counts by its
--       limits),
--       then per rule: algorithm (1 sliding_log, 2 fixed_window, 3 gcra, 4 sliding_window,
--       5 a calendar window: a fixed window whose windows the store's calendar gives), limit,
--       window µs; a calendar window then gives four instants µs, the starts of three
--       consecutive windows and the third's end, around the caller's clock: the window
--       holding this script's now is one of them (Lua knows no time zones)
--     bans      number of ban keys
--     writes bans  1 = this check may ban the offender (it consumes and a limiter bans):
--               the next 2 * bans arguments hold each ban key's target kind and target
--               value, and its KEYS end with the ban index; 0 = neither
--     report    0 = the plain reply; Cluster stores only, for one slot of a check spread over
--               several: 1 = append what this check recorded, so that the store can undo the
--               reservation (undo.lua) when another hash slot denies; 2 = also append each
--               rule's outcome at cost 0, the state as it stays once undone
--   then the targets, if the check writes bans.
-- Reply: one array per check, in call order, of integers:
--   allowed (1/0: every enforced limiter admits), blocked_us (-1 = not banned), banned_us (-1 = this check banned nobody),
--   then, unless blocked, per rule (limiters in order, rules in order):
--   allowed (1/0, plus twice the limit an override set, if one did), remaining,
--   reset_after_us, retry_after_us (-1 = none)
--   then, if report = 0 and the check recorded its admission: now (for a refund's receipt)
--   then, if report > 0: recorded (1/0); if recorded: now (the sliding-log score), then per
--   rule two integers: sliding log: retried members of its log (see the ZADD below), µs
--   until the newest entry before this one leaves (0: none); fixed window: window start,
--   count written; gcra: tat before (at least now), tat written; sliding window: window start
--   (plus 1 if the previous window counts), count written (enough for the store to
--   work out each rule's outcome at cost 0 itself);
--   then, if report = 2, every rule admitted and nothing was recorded (a peek, or cost 0),
--   per rule the four integers of its outcome at cost 0
--
-- Lua numbers are doubles: integers below 2^53 (µs timestamps are ~1.8e15) are exact, but
-- a / b is not floor division and tostring() keeps only 14 digits, hence divmod() and
-- format('%d'). Numbers given to redis.call are formatted by Redis with 17 digits, which
-- costs more than the whole rest of a call: the common path hands it strings.
--
-- Cost: Redis runs this whole chunk on every call, and on the server a tonumber() (strtod), a
-- format(), a new table or closure (each upvalue is looked up when the closure is made), a
-- table that grows, or an argument each cost about a third of a cheap Redis command. So the
-- plan comes packed in one argument, the checks run in a loop of the chunk itself (not a
-- function), and the common path (sliding logs that admit) reads the plan once into two flat
-- tables made at their usual size (reused by every check of a call), counts a limiter's log
-- once over its longest window (an empty log answers every rule at once, and needs no trim),
-- looks up the newest entry only when an outcome shows it, and builds the evaluators and the
-- ban writer only when a check needs them. A batch pays the call's own cost (the command,
-- this chunk, TIME) once.

--@include common.lua

local SLIDING_LOG, FIXED_WINDOW, GCRA, SLIDING_WINDOW, CALENDAR = 1, 2, 3, 4, 5

-- The check being evaluated: its plan's integers (p[1] the nonce, p[2] .. the integers), its
-- time and settings.
local p, nonce, cost, consume, report -- and common.lua's now, ttl_slack_ms
local delay = 0 -- how long a GCRA rule's units may wait, µs
-- The check's shadow limiters (false: none; else shadow[l] is true, then 'denied' once it
-- would deny), made only for a check that has one.
local shadow
local server_now = false -- TIME, read once per call when a check needs it

-- The plan of the check being evaluated, in two flat tables (a table per rule would cost
-- more than a Redis command):
--   rule[4i-3 .. 4i]      rule i (reply order): algorithm, limit, window µs (a calendar
--                         window: where its instants start in p), key
--   limiter[6l-5 .. 6l]   limiter l: first rule, last rule, the index in p of its ban
--                         duration, factor and cap (false: it bans nobody), its sliding log's
--                         key (false: none), the longest sliding-log window µs (0: none),
--                         and, once counted, the log's entries in that window
-- Made at the size of a common plan (4 rules, 2 limiters): Lua 5.1 has no table.new, and
-- growing a table costs about as much as a Redis command. A later check of the call
-- overwrites what it uses and reads nothing past it.
local rule = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }
local limiter = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }

-- The evaluators of rules, built only when a call needs one: the common path (a sliding log
-- with no live entry, which admits) answers without them, and a closure made on every call
-- costs about a cheap Redis command (each of its upvalues is looked up when it is made).
local edge, sliding_log, fixed_window, gcra, sliding_window, evaluate, calendar_window
-- Per sliding-window rule i evaluated, the previous window's count, for its write.
local sw_previous
local function build_evaluators()
  -- The calendar window holding now, from the four instants at p[b .. b + 3] (see ARGV): its
  -- start and end. A caller whose clock is a whole window off gets the nearest.
  calendar_window = function(b)
    if now < p[b + 1] then
      return p[b], p[b + 1]
    elseif now < p[b + 2] then
      return p[b + 1], p[b + 2]
    end
    return p[b + 2], p[b + 3]
  end

  -- The lower bound of a sliding window w: live entries are t > now - w (all while now < w).
  edge = function(w)
    if now >= w then
      return format('(%d', now - w)
    end
    return '-inf'
  end

  -- Each evaluator gives rule i's outcome at cost c: allowed (1/0), remaining, reset_after,
  -- retry_after, then, when it admits, the two integers of its record (see the header).

  -- `live` is the count of the rule's log over the limiter's longest window, `longest`.
  sliding_log = function(i, c, live, longest)
    local r = 4 * i
    local lim, w, log = rule[r - 2], rule[r - 1], rule[r]
    local count = live
    if live > 0 and w ~= longest then
      count = call('ZCOUNT', log, edge(w), '+inf')
    end
    -- µs until the newest live entry leaves (0: none), looked up only when shown.
    local newest = 0
    if count > 0 and (c == 0 or report > 0 or count + c > lim) then
      newest = call('ZRANGE', log, '-1', '-1', 'WITHSCORES')[2] + w - now
    end
    if count + c <= lim then
      if c > 0 then
        return 1, lim - count - c, w, -1, 0, newest
      end
      return 1, lim - count, newest, -1, 0, newest
    end
    -- The request fits once the (count + c - lim) oldest live entries have left.
    local must_leave = count + c - lim
    local retry = -1
    if must_leave <= count then
      local entry = call('ZRANGEBYSCORE', log, edge(w), '+inf', 'WITHSCORES', 'LIMIT',
        format('%d', must_leave - 1), '1')
      retry = entry[2] + w - now
    end
    return 0, lim - math.min(count, lim), newest, retry
  end

  fixed_window = function(i, c)
    local r = 4 * i
    local lim, w = rule[r - 2], rule[r - 1]
    local start, finish
    if rule[r - 3] == CALENDAR then
      start, finish = calendar_window(w)
    else
      local _, into = divmod(now, w)
      start = now - into
      finish = start + w
    end
    local count = 0
    local value = call('GET', rule[r])
    if value then
      local sep = string.find(value, ':', 1, true)
      if sep and tonumber(string.sub(value, 1, sep - 1)) == start then
        count = tonumber(string.sub(value, sep + 1)) or 0
      end
    end
    local reset = finish - now
    if count + c <= lim then
      local shown = reset
      if count + c == 0 then
        shown = 0
      end
      return 1, lim - count - c, shown, -1, start, count + c
    end
    if c > lim then
      -- A cost above the limit fits in no window.
      return 0, lim - math.min(count, lim), reset, -1
    end
    return 0, lim - math.min(count, lim), reset, reset
  end

  gcra = function(i, c)
    local r = 4 * i
    local lim = rule[r - 2]
    local interval = math.max(1, (divmod(rule[r - 1], lim)))
    local capacity = interval * lim
    local value = call('GET', rule[r])
    local tat = (value and tonumber(value)) or now
    if tat < now then
      tat = now
    end
    local new_tat = tat + interval * c
    if c <= lim and new_tat - now <= capacity + delay then
      -- Within the delay the units wait for their place: nothing more fits now.
      local room = math.max(0, capacity - (new_tat - now))
      return 1, (divmod(room, interval)), new_tat - now, -1, tat, new_tat
    end
    local remaining = 0
    if capacity > tat - now then
      remaining = divmod(capacity - (tat - now), interval)
    end
    if c > lim then
      -- More units than the limit never fit, however long they may wait.
      return 0, remaining, tat - now, -1
    end
    return 0, remaining, tat - now, new_tat - capacity - delay - now
  end

  -- Mirrors tollgate::algorithm::sliding_window: windows of w_ms whole milliseconds, the
  -- previous window weighed by the whole milliseconds of it the sliding window still covers.
  -- limit * w_ms is at most 2^51 (the policy checks it), so every product below is exact.
  sliding_window = function(i, c)
    local r = 4 * i
    local lim, w = rule[r - 2], rule[r - 1]
    local _, into = divmod(now, w)
    local start = now - into
    local previous, count = 0, 0
    local value = call('GET', rule[r])
    if value then
      local s1 = string.find(value, ':', 1, true)
      local s2 = s1 and string.find(value, ':', s1 + 1, true)
      if s2 then
        local at = tonumber(string.sub(value, 1, s1 - 1))
        local n = tonumber(string.sub(value, s2 + 1)) or 0
        if at == start then
          previous, count = tonumber(string.sub(value, s1 + 1, s2 - 1)) or 0, n
        elseif at == start - w then
          previous = n
        end
      end
    end
    -- Made by the first sliding-window rule of a call: other calls pay no table.
    sw_previous = sw_previous or {}
    sw_previous[i] = previous
    local w_ms = divmod(w, 1000)
    local into_ms = divmod(into, 1000)
    local capacity = lim * w_ms
    local scaled = previous * (w_ms - into_ms) + count * w_ms
    local function reset(n)
      if n > 0 then
        return start + 2 * w - now
      elseif previous > 0 then
        return start + w - now
      end
      return 0
    end
    -- The flag in the record's start: whether the previous window counts (for the reset a
    -- Cluster store works out once this write is undone).
    local flagged = start
    if previous > 0 then
      flagged = start + 1
    end
    if c <= lim and scaled + c * w_ms <= capacity then
      return 1, (divmod(capacity - scaled - c * w_ms, w_ms)), reset(count + c), -1, flagged, count + c
    end
    -- The first whole millisecond e of a window with fading * (w_ms - e) <= room * w_ms.
    local function first(fading, room)
      if fading == 0 then
        return 0
      end
      return math.max(0, w_ms - (divmod(room * w_ms, fading)))
    end
    local retry = -1
    if c <= lim then
      local at = false
      if lim - c >= count then
        local e = math.max(first(previous, lim - c - count), into_ms)
        if e < w_ms then
          at = start + e * 1000
        end
      end
      if not at then
        at = start + w + first(count, lim - c) * 1000
      end
      retry = math.max(0, at - now)
    end
    local remaining = 0
    if capacity > scaled then
      remaining = divmod(capacity - scaled, w_ms)
    end
    return 0, remaining, reset(count), retry
  end

  evaluate = function(i, l, c)
    local k = rule[4 * i - 3]
    if k == SLIDING_LOG then
      return sliding_log(i, c, limiter[6 * l], limiter[6 * l - 1])
    elseif k == FIXED_WINDOW or k == CALENDAR then
      return fixed_window(i, c)
    elseif k == GCRA then
      return gcra(i, c)
    elseif k == SLIDING_WINDOW then
      return sliding_window(i, c)
    end
    error('tollgate check: unknown algorithm code ' .. tostring(k))
  end
end

-- After a denial, the ban writer (ban_writer.lua), built only when a check takes that path.
local ban_offender

-- Every check of the call, in order: the plan of the n-th is ARGV[argi + 1], its keys start
-- after KEYS[keyi]. (A loop at the top of the chunk, not a function: a closure is made on
-- every call.)
local replies = {}
local keyi, argi, n = 0, 0, 0
local args = #ARGV
while argi < args do
  n = n + 1
  repeat -- one check; `break` ends it with replies[n] set
    argi = argi + 1
    local packed = ARGV[argi]
    p = { struct.unpack('<c8' .. string.rep('i8', (#packed - 8) / 8), packed) }
    nonce, now, cost = p[1], p[2], p[3]
    consume, delay = p[4] % 2 == 1, math.floor(p[4] / 2)
    ttl_slack_ms = 3600000
    if now < 0 then
      if not server_now then
        local t = call('TIME')
        server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      end
      now = server_now
      ttl_slack_ms = 0
    end

    local counters = false -- any fixed-window or GCRA rule
    local overridden = false -- rule i -> the limit an override set, for the reply
    shadow = false
    local limiters = p[5]
    local pi, rules = 5, 0 -- p[pi] was the last integer read
    for l = 1, limiters do
      local n, longest, flags = p[pi + 1], p[pi + 2], p[pi + 3]
      local fingerprint = false
      if flags >= 4 then
        flags = flags - 4
        fingerprint = true
      end
      local ban_at = false
      if flags == 1 then
        ban_at = pi + 4
        pi = pi + 3
      elseif flags == 2 then
        shadow = shadow or {}
        shadow[l] = true
      end
      pi = pi + 3
      local override = false
      if fingerprint then
        pi = pi + 1
        fingerprint = p[pi]
        keyi = keyi + 1
        override = KEYS[keyi]
      end
      local log = false
      if longest > 0 then
        keyi = keyi + 1
        log = KEYS[keyi]
      end
      for i = rules + 1, rules + n do
        local k, r = p[pi + 1], 4 * i
        rule[r - 3] = k
        rule[r - 2] = p[pi + 2]
        rule[r - 1] = p[pi + 3]
        if k == SLIDING_LOG then
          rule[r] = log
        else
          counters = true
          keyi = keyi + 1
          rule[r] = KEYS[keyi]
        end
        pi = pi + 3
        if k == CALENDAR then
          rule[r - 1] = pi + 1
          pi = pi + 4
        end
      end
      if override then
        -- The identity's override, read beside its counters: applied if it was made for these
        -- rules and has not ended.
        local o = call('GET', override)
        for j, limit in pairs(o and override_limits_of(o, n, fingerprint) or {}) do
          rule[4 * (rules + j) - 2] = limit
          overridden = overridden or {}
          overridden[rules + j] = limit
        end
      end
      local m = 6 * l
      limiter[m - 5] = rules + 1
      limiter[m - 4] = rules + n
      limiter[m - 3] = ban_at
      limiter[m - 2] = log
      limiter[m - 1] = longest
      limiter[m] = 0
      rules = rules + n
    end
    local bans = p[pi + 1]
    local ban_keys = keyi -- the ban keys are KEYS[ban_keys + 1 .. ban_keys + bans]
    local targets, ban_index = false, false -- ARGV index before the first target kind
    keyi = keyi + bans
    if p[pi + 2] == 1 then
      targets = argi
      argi = argi + 2 * bans
      keyi = keyi + 1
      ban_index = KEYS[keyi]
    end
    report = p[pi + 3]
    if keyi > #KEYS then
      error('tollgate check: ' .. #KEYS .. ' keys given, the checks need more')
    end
    if counters and not evaluate then
      build_evaluators()
    end

    -- A live ban blocks before any rule is looked at. Several ban keys that do not exist (the
    -- common case) cost one EXISTS.
    if bans > 0 and (bans == 1 or call('EXISTS', unpack(KEYS, ban_keys + 1, ban_keys + bans)) > 0) then
      local blocked = -1
      for k = ban_keys + 1, ban_keys + bans do
        local until_us = tonumber(call('HGET', KEYS[k], 'u') or '')
        if until_us and until_us > now and until_us - now > blocked then
          blocked = until_us - now
        end
      end
      if blocked >= 0 then
        replies[n] = { 0, blocked, -1 }
        break
      end
    end

    -- reply[4i .. 4i + 3] is rule i's outcome (sized for 4 rules, like `rule`; Redis reads a
    -- reply up to its first nil); record[2i - 1], record[2i] what it writes, kept only when
    -- needed.
    local reply = {
      1, -1, -1,
      nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
    }
    local record = (counters or report > 0) and {}
    local oldest = false -- per limiter whose log has live entries: now - its longest window as text
    -- Limiters of one policy often have the same rules: the last window's texts are reused.
    local text_window, trim_text, edge_text = false, false, false
    local allowed = true
    for l = 1, limiters do
      local m = 6 * l
      local log, longest = limiter[m - 2], limiter[m - 1]
      local live = 0
      if log then
        -- One count over the longest window: when it is 0, so is every rule's.
        if now >= longest then
          if longest ~= text_window then
            trim_text = format('%d', now - longest)
            text_window, edge_text = longest, '(' .. trim_text
          end
          live = call('ZCOUNT', log, edge_text, '+inf')
          if live > 0 then
            -- For the trim when the check is recorded. A log with no entry in its longest
            -- window is not trimmed: its entries are older than that window, so its last
            -- write, and the TTL that write set (the longest window), are too; it has
            -- expired (under a test clock, with its hour of slack, they linger unseen until
            -- the next trim or that hour ends).
            oldest = oldest or {}
            oldest[l] = trim_text
          end
        else
          live = call('ZCOUNT', log, '-inf', '+inf')
        end
        limiter[m] = live
      end
      for i = limiter[m - 5], limiter[m - 4] do
        local j = 4 * i -- rule[j - 3 .. j], reply[j .. j + 3]
        local ok, remaining, reset, retry, a, b
        if rule[j - 3] == SLIDING_LOG and live == 0 and cost <= rule[j - 2] then
          -- Empty over the longest window, so over this one: what sliding_log() answers for a
          -- count of 0, without the call (a fresh key's common case; a call costs ~1/3 command).
          ok, remaining, retry, a, b = 1, rule[j - 2] - cost, -1, 0, 0
          reset = cost > 0 and rule[j - 1] or 0
        elseif rule[j - 3] == SLIDING_LOG then
          if not evaluate then
            build_evaluators()
          end
          ok, remaining, reset, retry, a, b = sliding_log(i, cost, live, longest)
        else
          ok, remaining, reset, retry, a, b = evaluate(i, l, cost)
        end
        reply[j] = ok
        reply[j + 1] = remaining
        reply[j + 2] = reset
        reply[j + 3] = retry
        if record then
          record[2 * i - 1] = a or 0
          record[2 * i] = b or 0
        end
        if ok == 0 then
          if shadow and shadow[l] then
            shadow[l] = 'denied'
          else
            allowed = false
          end
        end
      end
    end
    if allowed and shadow then
      -- A shadow limiter that would deny records nothing: its rules that would admit report
      -- the state as it stays.
      for l, state in pairs(shadow) do
        if state == 'denied' then
          if not evaluate then
            build_evaluators()
          end
          for i = limiter[6 * l - 5], limiter[6 * l - 4] do
            local j = 4 * i
            if reply[j] == 1 then
              reply[j], reply[j + 1], reply[j + 2], reply[j + 3] = evaluate(i, l, 0)
            end
          end
        end
      end
    end

    local recorded = false
    -- Cluster stores: how each rule stays if another slot denies. (When this check records,
    -- the store works that out from the record instead.)
    local zero = false
    if allowed and report >= 2 and not (consume and cost > 0) then
      if not evaluate then
        build_evaluators()
      end
      zero = {}
      for l = 1, limiters do
        for i = limiter[6 * l - 5], limiter[6 * l - 4] do
          local ok, remaining, reset, retry = evaluate(i, l, 0)
          zero[#zero + 1] = ok
          zero[#zero + 1] = remaining
          zero[#zero + 1] = reset
          zero[#zero + 1] = retry
        end
      end
    end
    if not allowed then
      if not evaluate then
        build_evaluators()
      end
      -- Nothing is recorded: rules that would have admitted report the state as it stays.
      for l = 1, limiters do
        for i = limiter[6 * l - 5], limiter[6 * l - 4] do
          local j = 4 * i
          if reply[j] == 1 then
            reply[j], reply[j + 1], reply[j + 2], reply[j + 3] = evaluate(i, l, 0)
          end
        end
      end
      reply[1] = 0
      if targets then
        -- Bans every target for the longest ban of the denying limiters that ban.
        local denying = {}
        for l = 1, limiters do
          local m = 6 * l
          local at = limiter[m - 3]
          if at then
            for i = limiter[m - 5], limiter[m - 4] do
              -- A cost above the rule's limit (an override's) is no client's violation.
              if reply[4 * i] == 0 and cost <= rule[4 * i - 2] then
                denying[#denying + 1] = p[at]
                denying[#denying + 1] = p[at + 1]
                denying[#denying + 1] = p[at + 2]
                break
              end
            end
          end
        end
        if #denying > 0 then
          -- Its ban keys are KEYS[ban_keys + 1 .. ban_keys + bans], their targets
          -- ARGV[targets + 1 ..].
          local keys, kinds_values = {}, {}
          for b = 1, bans do
            keys[b] = KEYS[ban_keys + b]
            kinds_values[2 * b - 1] = ARGV[targets + 2 * b - 1]
            kinds_values[2 * b] = ARGV[targets + 2 * b]
          end
          if not ban_offender then
            ban_offender = (function()
--@include ban_writer.lua
              return ban_offender
            end)()
          end
          reply[3] = (ban_offender(denying, keys, kinds_values, ban_index))
        end
      end
    elseif consume and cost > 0 then
      recorded = true
      local score = format('%d', now)
      local ttl_window, ttl_text = false, false -- the last log TTL, reused as above
      for l = 1, limiters do
        local m = 6 * l
        local log, longest = limiter[m - 2], limiter[m - 1]
        if shadow and shadow[l] == 'denied' then
          -- A shadow limiter that would deny: nothing to record.
          log = false
        end
        if log then
          if oldest and oldest[l] then
            call('ZREMRANGEBYSCORE', log, '-inf', oldest[l])
          end
          -- ZADD NX reports what it added: a member that already exists (a nonce collision)
          -- would otherwise silently count once for two units.
          local missing
          if cost == 1 then
            missing = 1 - call('ZADD', log, 'NX', score, nonce .. '1')
          else
            missing = 0
            local unit = 1
            while unit <= cost do
              local upto = math.min(cost, unit + 499)
              local args = {}
              for u = unit, upto do
                args[#args + 1] = score
                args[#args + 1] = nonce .. format('%d', u)
              end
              missing = missing + (upto - unit + 1) - call('ZADD', log, 'NX', unpack(args))
              unit = upto + 1
            end
          end
          local attempt = 0
          while missing > 0 do
            attempt = attempt + 1
            if attempt > 1000 then
              error('tollgate check: cannot find a free sliding-log member')
            end
            missing = missing - call('ZADD', log, 'NX', score, nonce .. 'r' .. format('%d', attempt))
          end
          if longest ~= ttl_window then
            ttl_window, ttl_text = longest, format('%d', ttl_ms(longest))
          end
          call('PEXPIRE', log, ttl_text)
          -- Every sliding-log rule of this limiter records the members retried.
          if record and attempt > 0 then
            for i = limiter[m - 5], limiter[m - 4] do
              if rule[4 * i - 3] == SLIDING_LOG then
                record[2 * i - 1] = attempt
              end
            end
          end
        end
        for i = limiter[m - 5], limiter[m - 4] do
          local r = 4 * i
          local k = rule[r - 3]
          if shadow and shadow[l] == 'denied' then
            k = false
          end
          if k == FIXED_WINDOW then
            local start, count = record[2 * i - 1], record[2 * i]
            call('SET', rule[r], format('%d:%d', start, count),
              'PX', format('%d', ttl_ms(start + rule[r - 1] - now)))
          elseif k == CALENDAR then
            local start, count = record[2 * i - 1], record[2 * i]
            local _, finish = calendar_window(rule[r - 1])
            call('SET', rule[r], format('%d:%d', start, count),
              'PX', format('%d', ttl_ms(finish - now)))
          elseif k == GCRA then
            local tat = record[2 * i]
            call('SET', rule[r], format('%d', tat), 'PX', format('%d', ttl_ms(tat - now)))
          elseif k == SLIDING_WINDOW then
            local _, flag = divmod(record[2 * i - 1], 1000)
            local start = record[2 * i - 1] - flag
            -- This window's count fades over the next one.
            call('SET', rule[r], format('%d:%d:%d', start, sw_previous[i], record[2 * i]),
              'PX', format('%d', ttl_ms(start + 2 * rule[r - 1] - now)))
          end
        end
      end
    end

    if report > 0 then
      reply[#reply + 1] = recorded and 1 or 0
      if recorded then
        reply[#reply + 1] = now
        for _, v in ipairs(record) do
          reply[#reply + 1] = v
        end
      end
      if zero then
        for _, v in ipairs(zero) do
          reply[#reply + 1] = v
        end
      end
    elseif recorded then
      reply[#reply + 1] = now
    end
    if overridden then
      for i, lim in pairs(overridden) do
        reply[4 * i] = reply[4 * i] + 2 * lim
      end
    end
    replies[n] = reply
  until true
end
if keyi ~= #KEYS then
  return redis.error_reply('tollgate check: ' .. #KEYS .. ' keys given, the checks need ' .. keyi)
end
return replies
