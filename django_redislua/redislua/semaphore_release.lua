-- Give back one permit of a counting semaphore and wake the waiters.
--
-- KEYS[1]  the permits: a sorted set, member = permit id, score = expiry (ms, server clock).
-- ARGV[1]  the permit id.
-- ARGV[2]  the channel waiters subscribe to (a PUBLISH target, not a key).
--
-- Returns 1 when the permit was held and is now free, 0 when it had expired (or was never held).

if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('PUBLISH', ARGV[2], 'released')
return 1
