-- The single-policy driver (a fragment: KEYS and ARGV as ratelimit.lua's, with one policy).
-- A function, so that a Functions library defines it once.
local function decide_one(KEYS, ARGV)
  local now = ARGV[2]
  if now == '' then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  else
    now = given_now(now)
  end
  local algorithm = ALGORITHMS[ARGV[3]]
  if not algorithm then
    return redis.error_reply('ERR redislua: unknown algorithm ' .. tostring(ARGV[3]))
  end
  -- One policy: consuming only when allowed is already all-or-nothing.
  local consume = ARGV[1] == 'hit' or (ARGV[1] == 'soft' and ARGV[8] == '0')
  local allowed, remaining, reset, retry = algorithm(
    KEYS[1], now, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], consume)
  return {allowed and 1 or 0, math.max(0, remaining), math.max(0, reset), math.max(0, retry)}
end
