-- Cluster: bans the offender after a denial by limiters that ban, as check.lua does on a
-- standalone server (the same writer: ban_writer.lua).
-- KEYS     the ban keys of one hash slot, then the ban index if it shares their slot
-- ARGV     1 now (see prelude.lua), 2 number of denying bans, then per ban: duration µs,
--          factor, cap µs; then per ban key: target kind, target value
-- Reply    the longest ban written (µs), then each ban's end (µs), in KEYS order

--@include ban_writer.lua

local denying = {}
local argi = 2
for _ = 1, tonumber(ARGV[2]) do
  denying[#denying + 1] = tonumber(ARGV[argi + 1])
  denying[#denying + 1] = tonumber(ARGV[argi + 2])
  denying[#denying + 1] = tonumber(ARGV[argi + 3])
  argi = argi + 3
end
local keys, targets = {}, {}
for i = argi + 1, #ARGV do
  targets[#targets + 1] = ARGV[i]
end
for b = 1, #targets / 2 do
  keys[b] = KEYS[b]
end
local index = KEYS[#keys + 1] or false
local longest, ends = ban_offender(denying, keys, targets, index)
local reply = { longest }
for b = 1, #ends do
  reply[b + 1] = ends[b]
end
return reply
