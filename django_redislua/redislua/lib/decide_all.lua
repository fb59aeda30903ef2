-- The driver of ratelimit.lua: one or more policies decided together (a fragment: see
-- ratelimit.lua for KEYS/ARGV). A function, so that a Functions library defines it once.
local function decide_all(KEYS, ARGV)
  local now = ARGV[2]
--#include lib/clock.lua
  local hit = ARGV[1] == 'hit' or ARGV[1] == 'soft'
  -- N policies bring 2 KEYS and 7 ARGV each, the kept rates 1 KEY and 2 ARGV each.
  local n = (#ARGV - 2 - 2 * #KEYS) / 3
  local kept = false  -- policy i -> j, its kept rate's: KEYS[2N + j], ARGV[2 + 7N + 2j - 1..]
  if #KEYS > 2 * n then
    kept = {}
    for j = 1, #KEYS - 2 * n do kept[tonumber(ARGV[2 + 7 * n + 2 * j - 1])] = j end
  end

  -- Each policy's live override, read once (lib/override.lua): its kind (false: none), end,
  -- and the limit, param and extra to decide with.
  local found = {}
  local function override_of(i)
    local o = 3 + 7 * (i - 1)
    local ovkey, name, code = KEYS[n + i], ARGV[o + 6], ARGV[o]
    local limit, param, extra = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), ARGV[o + 4]
--#include lib/override.lua
    return {override or false, override_until, limit, param, extra}
  end
  for i = 1, n do found[i] = override_of(i) end

  -- Decide every policy without writing; then, on a hit, decide again consuming those that may
  -- consume. Keys are distinct and nothing was written in between, so the second pass decides
  -- the same as the first for every policy it touches. (The engine sends a single policy to
  -- its algorithm's own script, which decides once.) An override's block or allow consumes
  -- nothing.
  local function decide(i, consume)
    local o, ov = 3 + 7 * (i - 1), found[i]
    if ov[1] == 'b' then return false, 0, ov[2] - now, ov[2] - now end
    if ov[1] == 'a' then return true, ov[3], 0, 0 end
    local cost = tonumber(ARGV[o + 3])
    if cost > ov[3] then return false, ov[3], 0, -1 end  -- above a changed rate's capacity
    return decide_policy(ARGV[o], KEYS[i], now, ov[3], ov[4], cost, ov[5], consume, not ov[1])
  end

  local reply, gates_allow = {}, ARGV[1] ~= 'soft'
  for i = 1, n do
    local allowed, remaining, reset, retry = decide(i, false)
    if allowed == nil then
      return redis.error_reply('ERR redislua: unknown algorithm ' .. tostring(ARGV[3 + 7 * (i - 1)]))
    end
--#include lib/clamp.lua
    local kind = found[i][1]
    reply[6 * i - 5] = (allowed and 1 or 0) + (kind == 'r' and 4 or kind and 2 or 0)
    reply[6 * i - 4] = remaining
    reply[6 * i - 3] = reset
    reply[6 * i - 2] = retry
    reply[6 * i - 1] = found[i][3]
    reply[6 * i] = kind and found[i][2] - now or 0  -- how long the override lasts
    if not allowed and ARGV[3 + 7 * (i - 1) + 5] == '1' then gates_allow = false end
  end
  if hit then
    for i = 1, n do
      local gate = ARGV[3 + 7 * (i - 1) + 5] == '1'
      if reply[6 * i - 5] % 2 == 1 and (gates_allow or not gate) then
        local _, remaining, reset, retry = decide(i, true)
--#include lib/clamp.lua
        reply[6 * i - 4] = remaining
        reply[6 * i - 3] = reset
        reply[6 * i - 2] = retry
        local j = kept and kept[i]
        if j and found[i][1] ~= 'a' then  -- an override's allow wrote nothing
          local key, rate_key, rate_record = KEYS[i], KEYS[2 * n + j], ARGV[2 + 7 * n + 2 * j]
--#include lib/keep_rate.lua
        end
      end
    end
  end
  return reply
end
