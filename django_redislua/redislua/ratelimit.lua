-- Rate-limit decision for one or more policies in one call: the gating policies all-or-nothing
-- among themselves, the others (soft: block=False) each on its own.
--
-- KEYS[i]  the state key of policy i (one key per policy, all distinct; same hash tag for a
--          cluster call).
-- ARGV[1]  "hit" (consume what is allowed, see below), "peek" (write nothing), or "soft" (a
--          hit whose gating policies are already denied by the caller: only soft ones consume).
-- ARGV[2]  current time in microseconds, or "" to read the server clock with TIME
--          (tests inject time here; production always sends "").
-- Then six ARGV per policy i, starting at ARGV[3 + 6 * (i - 1)]:
--   algorithm code ("fw", "sl", "sw", "tb", "lb", "gc", "cc"),
--   limit (count per period, or capacity/burst, or slots),
--   param (period or lease timeout in integer microseconds; for the buckets the numerator p
--          of the interval between requests, p / q microseconds),
--   cost (integer >= 1, at most limit),
--   extra (a unique nonce for "sl", the lease id for "cc", q for the buckets, otherwise ""),
--   gate ("1": a denial by this policy denies the request, "0": it only marks it).
--
-- Returns four integers per policy: allowed (1/0), remaining, reset_after (us),
-- retry_after (us; 0 when allowed). On a hit, a gating policy consumes only when every gating
-- policy allows (a request denied by one consumes nothing from the others); a soft policy
-- consumes whenever it allows, whatever the others decided.

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
local hit = ARGV[1] == 'hit' or ARGV[1] == 'soft'

if #KEYS == 1 then
  -- One policy, the common case: consuming only when allowed is already all-or-nothing.
  local algorithm = ALGORITHMS[ARGV[3]]
  if not algorithm then
    return redis.error_reply('ERR redislua: unknown algorithm ' .. tostring(ARGV[3]))
  end
  local consume = ARGV[1] == 'hit' or (ARGV[1] == 'soft' and ARGV[8] == '0')
  local allowed, remaining, reset, retry = algorithm(
    KEYS[1], now, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], consume)
  return {allowed and 1 or 0, math.max(0, remaining), math.max(0, reset), math.max(0, retry)}
end

-- Several policies: decide every one without writing; then, on a hit, decide again consuming
-- those that may consume. Keys are distinct and nothing was written in between, so the second
-- pass decides the same as the first for every policy it touches.
local function decide_one(i, consume)
  local o = 3 + 6 * (i - 1)
  local algorithm = ALGORITHMS[ARGV[o]]
  if not algorithm then
    return nil
  end
  return algorithm(KEYS[i], now, tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]),
                   tonumber(ARGV[o + 3]), ARGV[o + 4], consume)
end

local reply, gates_allow = {}, ARGV[1] ~= 'soft'
for i = 1, #KEYS do
  local allowed, remaining, reset, retry = decide_one(i, false)
  if allowed == nil then
    return redis.error_reply('ERR redislua: unknown algorithm ' .. tostring(ARGV[3 + 6 * (i - 1)]))
  end
  reply[4 * i - 3] = allowed and 1 or 0
  reply[4 * i - 2] = math.max(0, remaining)
  reply[4 * i - 1] = math.max(0, reset)
  reply[4 * i] = math.max(0, retry)
  if not allowed and ARGV[3 + 6 * (i - 1) + 5] == '1' then gates_allow = false end
end
if hit then
  for i = 1, #KEYS do
    local gate = ARGV[3 + 6 * (i - 1) + 5] == '1'
    if reply[4 * i - 3] == 1 and (gates_allow or not gate) then
      local allowed, remaining, reset, retry = decide_one(i, true)
      reply[4 * i - 2] = math.max(0, remaining)
      reply[4 * i - 1] = math.max(0, reset)
      reply[4 * i] = math.max(0, retry)
    end
  end
end
return reply
