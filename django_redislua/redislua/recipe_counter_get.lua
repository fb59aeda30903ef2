-- CappedCounter.value: read a counter (0 once its period ended). Writes nothing.
--
-- KEYS[1]  the counter: a hash {n = value, until = end of its period (us)}.
-- ARGV[1]  now: "" (TIME), "+N" (TIME + N us) or an injected time in us (see lib/clock.lua).
--
-- Returns the value.
local now = ARGV[1]
--#include lib/clock.lua
local state = redis.call('HMGET', KEYS[1], 'n', 'until')
local value, ends = tonumber(state[1]), tonumber(state[2])
if not value or not ends or ends <= now then
  return 0
end
return value
