-- A waiter gives up (its blocking timeout passed): leave the queue, unless a release handed it
-- the lock in the meantime, in which case it takes the lock after all.
--
-- KEYS[1]  the lock hash {owner, count, token, name, granted}.
-- KEYS[2]  the waiter queue (see lock_acquire.lua).
-- ARGV[1]  the owner token.
-- ARGV[2]  the caller's queue member ("<owner>:<TTL ms>").
--
-- Returns {1, fencing token, re-entry count} when the lock was handed to the caller, else {0, 0, 0}.

redis.call('ZREM', KEYS[2], ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'owner', 'count', 'token', 'granted')
if state[1] == ARGV[1] and state[4] then
  redis.call('HDEL', KEYS[1], 'granted')
  return {1, tonumber(state[3]), tonumber(state[2])}
end
return {0, 0, 0}
