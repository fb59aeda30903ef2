-- Acquire a lock (SET NX PX semantics), or re-enter it in reentrant mode; hand out a fencing token.
--
-- KEYS[1]  the lock: a hash {owner, count, token, name} that expires after the TTL.
-- KEYS[2]  the fencing counter of this name. It never expires: tokens must only ever grow.
-- ARGV[1]  the owner token (random, 32 hex characters, held by the Lock object).
-- ARGV[2]  TTL in milliseconds (integer >= 1).
-- ARGV[3]  "1": the owner may re-enter (reentrant mode); "0": a second acquire by the owner waits.
-- ARGV[4]  the lock's name as the application wrote it (shown by the admin and redislua_locks).
--
-- Returns {1, fencing token, re-entry count} when acquired or re-entered,
-- {0, milliseconds until the current holder's lease expires, 0} when held by someone else.

local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', token, 'name', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token, 1}
end
if owner == ARGV[1] and ARGV[3] == '1' then
  local count = redis.call('HINCRBY', KEYS[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('HGET', KEYS[1], 'token')), count}
end
return {0, redis.call('PTTL', KEYS[1]), 0}
