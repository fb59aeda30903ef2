-- WindowStats.summary: count, total, minimum and maximum of the samples in the buckets the
-- window covers now (the current bucket and the BUCKETS - 1 before it). Writes nothing.
--
-- KEYS[1]  the statistics (see recipe_window_add.lua).
-- ARGV[1]  now: "" (TIME), "+N" (TIME + N us) or an injected time in us (see lib/clock.lua).
-- ARGV[2]  the bucket width in microseconds (integer >= 1).
-- ARGV[3]  the number of buckets (integer, 1 to 1000).
--
-- Returns {count, total, minimum, maximum}: numbers as text (exact: "%.17g"), minimum and
-- maximum "" when the count is 0.
local now = ARGV[1]
--#include lib/clock.lua
local width, buckets = tonumber(ARGV[2]), tonumber(ARGV[3])
local bucket = math.floor(now / width)
local state = redis.call('HGETALL', KEYS[1])
local fields = {}
for i = 1, #state, 2 do
  fields[state[i]] = state[i + 1]
end
local count, total, low, high = 0, 0, nil, nil
for slot = 0, buckets - 1 do
  local held = tonumber(fields['b' .. slot])
  if held and held <= bucket and held > bucket - buckets then
    count = count + tonumber(fields['n' .. slot])
    total = total + tonumber(fields['s' .. slot])
    local lo, hi = tonumber(fields['lo' .. slot]), tonumber(fields['hi' .. slot])
    if not low or lo < low then low = lo end
    if not high or hi > high then high = hi end
  end
end
local function text(n)
  if not n then return '' end
  return string.format('%.17g', n)
end
return {count, text(total), text(low), text(high)}
