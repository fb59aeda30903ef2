-- Acquire a lock (SET NX PX semantics), or re-enter it in reentrant mode; hand out a fencing token.
-- A waiter that is already subscribed to the wake-up channel also queues itself here, so the
-- next release can hand the lock straight to it (see lock_release.lua).
--
-- KEYS[1]  the lock: a hash {owner, count, token, name, granted} that expires after the TTL.
-- KEYS[2]  the fencing counter of this name. It never expires: tokens must only ever grow.
-- KEYS[3]  the waiter queue: a sorted set, member "<owner>:<TTL ms>", score = the time (server
--          clock, ms) after which the registration is stale and no hand-off goes to it.
-- ARGV[1]  the owner token (random, 32 hex characters, held by the Lock object).
-- ARGV[2]  TTL in milliseconds (integer >= 1).
-- ARGV[3]  "1": the owner may re-enter (reentrant mode); "0": a second acquire by the owner waits.
-- ARGV[4]  the lock's name as the application wrote it (shown by the admin and redislua_locks).
-- ARGV[5]  milliseconds to stay queued when the lock is held (0: do not queue).
--
-- Returns {1, fencing token, re-entry count} when acquired, re-entered, or handed over earlier,
-- {0, milliseconds until the current holder's lease expires, 0} when held by someone else.

local member = ARGV[1] .. ':' .. ARGV[2]
local stay = tonumber(ARGV[5])
local state = redis.call('HMGET', KEYS[1], 'owner', 'count', 'token', 'granted')
local owner = state[1]
if not owner then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', token, 'name', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[3], member)
  return {1, token, 1}
end
if owner == ARGV[1] then
  if state[4] and stay > 0 then
    -- A release handed the lock to this (queued) waiter; its wake-up message went unread.
    redis.call('HDEL', KEYS[1], 'granted')
    return {1, tonumber(state[3]), tonumber(state[2])}
  end
  if ARGV[3] == '1' then
    local count = redis.call('HINCRBY', KEYS[1], 'count', 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(state[3]), count}
  end
end
if stay > 0 then
  local t = redis.call('TIME')
  local until_ms = t[1] * 1000 + math.floor(t[2] / 1000) + stay
  redis.call('ZADD', KEYS[3], until_ms, member)
  -- The queue outlives its newest registration by a little, never forever.
  if redis.call('PTTL', KEYS[3]) < stay then
    redis.call('PEXPIRE', KEYS[3], stay + 1000)
  end
end
return {0, redis.call('PTTL', KEYS[1]), 0}
