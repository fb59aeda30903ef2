-- Read live overrides of one identity (see django_redislua/overrides.py).
--
-- KEYS[1]  the identity's override hash.
-- ARGV[1]  "now" as lib/clock.lua reads it; then ARGV[2..]: the fields to read (policy names
--          or "*"), at most 64.
--
-- Returns {now, value 1, metadata 1, value 2, metadata 2, ...}: now in server microseconds (a
-- string), each value and its "m:" metadata as stored, or false when absent. Whether a value
-- has ended (its end at or before now) is the caller's to read, as the decision scripts do.
local now = ARGV[1]
--#include lib/clock.lua
local fields = {}
for i = 2, math.min(#ARGV, 65) do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = 'm:' .. ARGV[i]
end
local reply = redis.call('HMGET', KEYS[1], unpack(fields))
table.insert(reply, 1, string.format('%.0f', now))
return reply
