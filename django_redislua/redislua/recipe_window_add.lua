-- WindowStats.add: record one sample. The window is cut into BUCKETS buckets of WIDTH us,
-- used in turn (bucket number floor(now / WIDTH), slot number % BUCKETS): memory per key is
-- five fields per slot, whatever the traffic.
--
-- KEYS[1]  the statistics: a hash {b<slot> = bucket number, n<slot> = count, s<slot> = total,
--          lo<slot> = minimum, hi<slot> = maximum}; it expires a window after the last sample.
-- ARGV[1]  now: "" (TIME), "+N" (TIME + N us) or an injected time in us (see lib/clock.lua).
-- ARGV[2]  the sample (a finite number, written as Python's repr writes it).
-- ARGV[3]  the bucket width in microseconds (integer >= 1).
-- ARGV[4]  the number of buckets (integer, 1 to 1000).
--
-- Returns 1, or 0 when the sample is older than what the slot holds (a clock that went back).
local now = ARGV[1]
--#include lib/clock.lua
local width, buckets = tonumber(ARGV[3]), tonumber(ARGV[4])
local bucket = math.floor(now / width)
local slot = string.format('%.0f', bucket % buckets)
local number = string.format('%.0f', bucket)
local sample = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'b' .. slot, 'lo' .. slot, 'hi' .. slot, 's' .. slot)
local held = tonumber(state[1])
if held and held > bucket then
  return 0
end
if held ~= bucket then
  redis.call('HSET', KEYS[1], 'b' .. slot, number, 'n' .. slot, 1, 's' .. slot, ARGV[2],
             'lo' .. slot, ARGV[2], 'hi' .. slot, ARGV[2])
else
  redis.call('HINCRBY', KEYS[1], 'n' .. slot, 1)
  -- Added here, as doubles, and written exactly: HINCRBYFLOAT rounds to 17 decimal places,
  -- which loses small samples entirely.
  redis.call('HSET', KEYS[1], 's' .. slot, string.format('%.17g', tonumber(state[4]) + sample))
  if sample < tonumber(state[2]) then
    redis.call('HSET', KEYS[1], 'lo' .. slot, ARGV[2])
  end
  if sample > tonumber(state[3]) then
    redis.call('HSET', KEYS[1], 'hi' .. slot, ARGV[2])
  end
end
-- Kept until its newest bucket leaves the window, and at least a second: what counts is the
-- bucket numbers stored (a summary and an add ignore buckets out of the window), so a key kept
-- longer changes no answer, while a key of a millisecond could vanish between two commands of
-- one transaction (the tests read it back that way).
redis.call('PEXPIRE', KEYS[1], math.max(1000, math.ceil(((bucket + buckets) * width - now) / 1000)))
return 1
