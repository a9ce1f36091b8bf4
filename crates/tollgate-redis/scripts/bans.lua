-- Blocklist: every ban in the index that has not ended.
-- KEYS[1]  the ban index (see prelude.lua). The ban keys it lists share its {ban} hash tag,
--          so they live in its slot even though they are not declared in KEYS.
-- ARGV     1 now (see prelude.lua)
-- Reply    flat: per ban, kind, value, µs left, strikes

local out = {}
for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. int(now), '+inf')) do
  local ban = redis.call('HMGET', key, 'u', 's', 'k', 'v')
  local until_us = tonumber(ban[1] or '')
  if until_us and until_us > now and ban[3] and ban[4] then
    out[#out + 1] = ban[3]
    out[#out + 1] = ban[4]
    out[#out + 1] = until_us - now
    out[#out + 1] = tonumber(ban[2] or '') or 1
  end
end
return out
