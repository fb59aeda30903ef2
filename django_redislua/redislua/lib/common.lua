-- Helpers shared by the rate-limit algorithms (a fragment: see ratelimit.lua for KEYS/ARGV).
-- Times and durations are integer microseconds held in Lua numbers (doubles, exact below 2^53).
-- Numbers passed straight to redis.call are sent exactly ("%.17g"); only concatenation needs
-- int(), since Lua's own tostring would print 1.7e+15 for a timestamp.
--
-- The O(1) algorithms keep their state in one string of doubles packed with the struct library
-- (exact integers below 2^53), led by a tag byte naming the algorithm: packing and unpacking is
-- a C call each, where formatting and matching text cost the script a third of its time. A
-- value of another shape (another tag, another length) counts as no state.
--
-- Every algorithm is ALGORITHMS[code](key, now, limit, param, cost, extra, consume) and returns
-- allowed (boolean), remaining, reset_after (us), retry_after (us). It writes only when
-- CONSUME is true and the request is allowed; with CONSUME false it only reads, so the driver
-- can decide several policies before committing any.

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

-- A TTL of US microseconds in whole milliseconds, rounded up (at least 1 ms): never shorter
-- than the state must live, never more than 1 ms longer. US / 1000 is correctly rounded and a
-- quotient below 2^53 / 1000 has an ulp under 0.002 ms, so a remainder of 1 us or more never
-- rounds away: math.ceil is exact for every integer US below 2^53.
local function ttl_ms(us)
  if us <= 1000 then return 1 end
  return math.ceil(us / 1000)
end

-- A number as an exact integer string.
local function int(n)
  return string.format('%.0f', n)
end

-- ARGV "now" when it is not "" (which reads TIME): a time in microseconds that a test injects,
-- or "+N": the server clock moved N microseconds ahead (the testing helpers' advance()).
local function given_now(arg)
  if string.byte(arg) == 43 then -- "+"
    local t = redis.call('TIME')
    return t[1] * 1000000 + t[2] + tonumber(string.sub(arg, 2))
  end
  return tonumber(arg)
end
