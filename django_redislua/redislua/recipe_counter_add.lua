-- CappedCounter.add: add AMOUNT to a counter unless the sum would pass the cap; the counter
-- starts at 0 and lives for one period from its first add (then starts again at 0).
--
-- KEYS[1]  the counter: a hash {n = value, until = end of its period (us)}; it expires with the
--          period.
-- ARGV[1]  now: "" (TIME), "+N" (TIME + N us) or an injected time in us (see lib/clock.lua).
-- ARGV[2]  amount to add (integer >= 1).
-- ARGV[3]  the cap (integer >= 0): the value never passes it.
-- ARGV[4]  the period in microseconds (integer >= 1).
--
-- Returns {value, 1 when the amount was added else 0}.
local now = ARGV[1]
--#include lib/clock.lua
local amount, cap, period = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'n', 'until')
local value, ends = tonumber(state[1]), tonumber(state[2])
if not value or not ends or ends <= now then
  value, ends = 0, now + period
end
if value + amount > cap then
  return {value, 0}
end
value = value + amount
redis.call('HSET', KEYS[1], 'n', value, 'until', string.format('%.0f', ends))
-- At least a second: the stored end of the period decides (an add or a read after it starts
-- from 0), so a key kept longer changes no answer, while a key of a millisecond could vanish
-- between two commands of one transaction (the tests read it back that way).
redis.call('PEXPIRE', KEYS[1], math.max(1000, math.ceil((ends - now) / 1000)))
return {value, 1}
