-- Blocklist: how many bans have not ended, from the index alone.
-- KEYS[1]  the ban index (see prelude.lua)
-- ARGV     1 now (see prelude.lua)
-- Reply    the count
--
-- Cost: O(log n) (ZCOUNT finds both ends of the range by rank), however many bans there are:
-- metrics read it at every scrape.

return redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
