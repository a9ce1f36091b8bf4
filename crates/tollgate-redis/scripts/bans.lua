-- Blocklist: the index entries of one page of the bans that have not ended, in the order
-- they end, then by key (the index's own order). It reads the index only (a script must
-- touch no key but its KEYS: a Cluster, where the bans live in other slots, and Dragonfly
-- refuse that): the store then reads each listed ban's hash (HMGET), skipping any lifted
-- meanwhile.
-- KEYS[1]  the ban index (ZSET: ban key -> end of ban µs)
-- ARGV     1 now (see prelude.lua), 2 the page size (at least 1), 3 and 4 the cursor: the end
--          (µs) and key of the last ban of the previous page, or '' and '' for the first page
-- Reply    flat: the next cursor (end µs as text, key), or '' and '' after the last page; now
--          (µs, as text); then each ban's key
--
-- Cost: O(log n + page size) (see index.lua's index_page).

--@include index.lua

return index_page(KEYS[1], math.max(1, tonumber(ARGV[2]) or 1), ARGV[3], ARGV[4])
