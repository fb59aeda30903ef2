-- WorkQueue.claim: first return expired claims to the queue (their workers died or stalled),
-- then claim the next task for VISIBILITY milliseconds, unless MAX_IN_FLIGHT tasks are claimed.
--
-- KEYS[1..7]  the queue's keys (see lib/queue_keys.lua).
-- ARGV[1]     the claim's token (random, 32 hex characters).
-- ARGV[2]     visibility timeout in milliseconds (integer >= 1).
-- ARGV[3]     the most tasks claimed at once (integer >= 1).
-- ARGV[4]     the most times a task is claimed before it goes to the dead tasks, or "".
--
-- Returns {id, payload, attempts, deadline (ms, server clock)}, or {} when nothing is pending,
-- or {0} when MAX_IN_FLIGHT tasks are claimed.
--#include lib/queue_keys.lua

local now = now_ms()
reclaim_expired(now, ARGV[4])
if redis.call('ZCARD', IN_FLIGHT) >= tonumber(ARGV[3]) then
  return {0}
end
local id = redis.call('LPOP', PENDING)
if not id then
  return {}
end
local deadline = now + tonumber(ARGV[2])
redis.call('ZADD', IN_FLIGHT, deadline, id)
redis.call('HSET', CLAIMS, id, ARGV[1])
local attempts = redis.call('HINCRBY', ATTEMPTS, id, 1)
return {id, redis.call('HGET', TASKS, id), attempts, deadline}
