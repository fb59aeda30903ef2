-- Helpers shared by the rate-limit algorithms (a fragment: see ratelimit.lua for KEYS/ARGV).
-- Times and durations are integer microseconds held in Lua numbers (doubles, exact below 2^53).

-- floor(a / b) for non-negative integers, corrected for the rounding of the double division.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- ceil(a / b) for non-negative integers.
local function cdiv(a, b)
  return idiv(a + b - 1, b)
end

-- Expire KEY after US microseconds, rounded up to whole milliseconds (at least 1 ms).
local function expire_us(key, us)
  redis.call('PEXPIRE', key, math.max(1, cdiv(us, 1000)))
end

-- A number as an exact integer string (tostring would print 1.7e+15 for a timestamp).
local function int(n)
  return string.format('%.0f', n)
end
