-- Rate-limit decision for one or more policies, all-or-nothing, in one call.
--
-- KEYS[i]  the state key of policy i (one key per policy, all distinct; same hash tag for a
--          cluster call).
-- ARGV[1]  "hit" (consume when every policy allows) or "peek" (write nothing).
-- ARGV[2]  current time in microseconds, or "" to read the server clock with TIME
--          (tests inject time here; production always sends "").
-- Then five ARGV per policy i, starting at ARGV[3 + 5 * (i - 1)]:
--   algorithm code ("fw", "sl", "sw", "tb", "lb", "gc", "cc"),
--   limit (count per period, or capacity/burst, or slots),
--   param (period, refill/drain interval, or lease timeout; integer microseconds),
--   cost (integer >= 1, at most limit),
--   extra (a unique nonce for "sl", the lease id for "cc", otherwise "").
--
-- Returns four integers per policy: allowed (1/0), remaining, reset_after (us),
-- retry_after (us; 0 when allowed). A request denied by one policy consumes nothing anywhere.

local ALGORITHMS = {}

--#include lib/common.lua
--#include lib/fixed_window.lua
--#include lib/sliding_log.lua
--#include lib/sliding_window.lua
--#include lib/token_bucket.lua
--#include lib/leaky_bucket.lua
--#include lib/gcra.lua
--#include lib/concurrency.lua

local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local hit = ARGV[1] == 'hit'

if #KEYS == 1 then
  -- One policy, the common case: consuming only when allowed is already all-or-nothing.
  local algorithm = ALGORITHMS[ARGV[3]]
  if not algorithm then
    return redis.error_reply('ERR redislua: unknown algorithm ' .. tostring(ARGV[3]))
  end
  local allowed, remaining, reset, retry = algorithm(
    KEYS[1], now, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], hit)
  return {allowed and 1 or 0, math.max(0, remaining), math.max(0, reset), math.max(0, retry)}
end

-- Several policies: decide every one without writing; only if all allow (and this is a hit),
-- decide again consuming. Nothing was written in between, so the second pass decides the same.
local function decide(consume)
  local reply, all_allowed = {}, true
  for i = 1, #KEYS do
    local o = 3 + 5 * (i - 1)
    local algorithm = ALGORITHMS[ARGV[o]]
    if not algorithm then
      return redis.error_reply('ERR redislua: unknown algorithm ' .. tostring(ARGV[o])), false
    end
    local allowed, remaining, reset, retry = algorithm(
      KEYS[i], now, tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]),
      ARGV[o + 4], consume)
    reply[4 * i - 3] = allowed and 1 or 0
    reply[4 * i - 2] = math.max(0, remaining)
    reply[4 * i - 1] = math.max(0, reset)
    reply[4 * i] = math.max(0, retry)
    all_allowed = all_allowed and allowed
  end
  return reply, all_allowed
end

local reply, all_allowed = decide(false)
if hit and all_allowed then
  reply = decide(true)
end
return reply
