-- tollgate: an index's pages, one source spliced (`--@include index.lua`) into bans.lua and
-- override.lua (after prelude.lua, whose `now`, `call` and `format` it uses). An index is a
-- sorted set of keys scored by when they end (µs; +inf: never), in its own order: by end, then
-- by key, byte by byte.

-- A score as Redis writes it ('inf' or '+inf' for never), as a number.
local function score_of(text)
  if text == 'inf' or text == '+inf' then
    return math.huge
  end
  return tonumber(text)
end

-- A score as a ZCOUNT bound: inclusive, or exclusive (`open`).
local function bound(score, open)
  local text = '+inf'
  if score ~= math.huge then
    text = format('%d', score)
  end
  if open then
    return '(' .. text
  end
  return text
end

-- Whether key `a` sorts after key `b` as a sorted set orders the keys of one score: byte by
-- byte (Lua's own `<` follows the collation of the server's locale).
local function bytes_after(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x > y
    end
  end
  return #a > #b
end

-- The rank of the first key after the cursor (`after_end`, `after_key`): right after the
-- cursor's key while it still ends then (ZSCORE, ZRANK: O(log n)); else, the key gone or
-- moved, the first of the keys that end then which sorts after it, found by halving them
-- (O(log^2 n)).
local function rank_after(index, after_end, after_key)
  local score = call('ZSCORE', index, after_key)
  if score and score_of(score) == after_end then
    return call('ZRANK', index, after_key) + 1
  end
  local low = call('ZCOUNT', index, '-inf', bound(after_end, true))
  local high = call('ZCOUNT', index, '-inf', bound(after_end, false))
  while low < high do
    local middle = math.floor((low + high) / 2)
    if bytes_after(call('ZRANGE', index, middle, middle)[1], after_key) then
      high = middle
    else
      low = middle + 1
    end
  end
  return low
end

-- One page of `index`: of the keys that end after now, those after the cursor (`after_end`,
-- `after_key`: the last of the page before, its end as text, 'inf' for never; '' and '' for
-- the first page), at most `limit` (at least 1). Reply, flat: the next cursor (its end as text, 'inf' for never, and its key), or
-- '' and '' after the last page; now (µs, as text); then the keys.
--
-- O(log n + limit): one ZRANGE from the rank where the page starts, found without walking the
-- keys before it, those that share the cursor's end included.
local function index_page(index, limit, after_end, after_key)
  after_end = score_of(after_end)
  local rank
  if after_end and after_end > now then
    rank = rank_after(index, after_end, after_key)
  else
    -- Every key before this rank has ended.
    rank = call('ZCOUNT', index, '-inf', format('%d', now))
  end
  local batch = call('ZRANGE', index, rank, rank + limit - 1, 'WITHSCORES')
  local out = { '', '', format('%d', now) }
  for i = 1, #batch, 2 do
    out[#out + 1] = batch[i]
  end
  if #batch > 0 and rank + #batch / 2 < call('ZCARD', index) then
    local last = score_of(batch[#batch])
    out[1] = last == math.huge and 'inf' or format('%d', last)
    out[2] = batch[#batch - 1]
  end
  return out
end
