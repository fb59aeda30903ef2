-- The driver of ratelimit.lua: one or more policies decided together (a fragment: see
-- ratelimit.lua for KEYS/ARGV). A function, so that a Functions library defines it once.
local function decide_all(KEYS, ARGV)
  local now = ARGV[2]
--#include lib/clock.lua
  local hit = ARGV[1] == 'hit' or ARGV[1] == 'soft'

  -- Decide every policy without writing; then, on a hit, decide again consuming those that may
  -- consume. Keys are distinct and nothing was written in between, so the second pass decides
  -- the same as the first for every policy it touches. (The engine sends a single policy to
  -- its algorithm's own script, which decides once.)
  local function decide(i, consume)
    local o = 3 + 6 * (i - 1)
    return decide_policy(ARGV[o], KEYS[i], now, tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]),
                         tonumber(ARGV[o + 3]), ARGV[o + 4], consume)
  end

  local reply, gates_allow = {}, ARGV[1] ~= 'soft'
  for i = 1, #KEYS do
    local allowed, remaining, reset, retry = decide(i, false)
    if allowed == nil then
      return redis.error_reply('ERR redislua: unknown algorithm ' .. tostring(ARGV[3 + 6 * (i - 1)]))
    end
--#include lib/clamp.lua
    reply[4 * i - 3] = allowed and 1 or 0
    reply[4 * i - 2] = remaining
    reply[4 * i - 1] = reset
    reply[4 * i] = retry
    if not allowed and ARGV[3 + 6 * (i - 1) + 5] == '1' then gates_allow = false end
  end
  if hit then
    for i = 1, #KEYS do
      local gate = ARGV[3 + 6 * (i - 1) + 5] == '1'
      if reply[4 * i - 3] == 1 and (gates_allow or not gate) then
        local _, remaining, reset, retry = decide(i, true)
--#include lib/clamp.lua
        reply[4 * i - 2] = remaining
        reply[4 * i - 1] = reset
        reply[4 * i] = retry
      end
    end
  end
  return reply
end
