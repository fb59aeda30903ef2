-- Take one permit of a counting semaphore whose permits expire (a crashed holder frees its own).
--
-- KEYS[1]  the permits: a sorted set, member = permit id, score = expiry (ms, server clock).
-- ARGV[1]  the permit id (random, 32 hex characters).
-- ARGV[2]  the limit: how many permits may be held at once (integer >= 1).
-- ARGV[3]  the permit's lease in milliseconds (integer >= 1).
--
-- Returns {1, 0} when the permit is granted (or renewed, if this id already holds one),
-- {0, milliseconds until the earliest permit expires} when all are taken.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(first[2]) - now}
