-- Release a lock if, and only if, the caller owns it. When it becomes free, hand it straight to
-- the queued waiter whose registration expires first (new fencing token, that waiter's lease)
-- and tell it so on the channel; with nobody queued, wake the waiters to try again.
--
-- KEYS[1]  the lock hash {owner, count, token, name, granted}.
-- KEYS[2]  the fencing counter of this name.
-- KEYS[3]  the waiter queue (see lock_acquire.lua).
-- ARGV[1]  the owner token.
-- ARGV[2]  "one": leave one re-entry (the lock stays held while count > 0); "all": release fully.
-- ARGV[3]  the channel waiters subscribe to (a PUBLISH target, not a key).
-- ARGV[4]  the lock's name as the application wrote it.
-- ARGV[5]  the caller's own queue member ("<owner>:<TTL ms>"), removed in any case: a waiter
--          that gave up releases through here too.
--
-- Publishes "granted <owner> <token>" or "released".
-- Returns -1 when the caller does not own the lock (expired, taken, force-released), otherwise
-- the re-entries still held (0 = released).

redis.call('ZREM', KEYS[3], ARGV[5])
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return -1
end
if ARGV[2] == 'one' then
  local count = redis.call('HINCRBY', KEYS[1], 'count', -1)
  if count > 0 then
    return count
  end
end
redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', t[1] * 1000 + math.floor(t[2] / 1000))
local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if not first then
  redis.call('PUBLISH', ARGV[3], 'released')
  return 0
end
redis.call('ZREM', KEYS[3], first)
local heir, ttl = string.match(first, '^(.*):(%d+)$')
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', heir, 'count', 1, 'token', token, 'name', ARGV[4],
           'granted', 1)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PUBLISH', ARGV[3], 'granted ' .. heir .. ' ' .. token)
return 0
