-- WorkQueue.ack / release / extend: act on a claimed task, only for the claim that holds it (a
-- worker whose claim expired and went to another worker changes nothing).
--
-- KEYS[1..7]  the queue's keys (see lib/queue_keys.lua).
-- ARGV[1]     "ack" (done: forget the task), "release" (back to the end of the queue now) or
--             "extend" (the claim lasts VISIBILITY milliseconds from now).
-- ARGV[2]     the task id.
-- ARGV[3]     the claim's token.
-- ARGV[4]     "extend": the visibility timeout in ms; "release": the most attempts, or "".
--
-- Returns 0 when the claim no longer holds the task; else 1 (ack, release) or the new deadline
-- (extend, ms on the server clock).
--#include lib/queue_keys.lua

local id = ARGV[2]
if redis.call('HGET', CLAIMS, id) ~= ARGV[3] then
  return 0
end
if ARGV[1] == 'ack' then
  redis.call('ZREM', IN_FLIGHT, id)
  redis.call('HDEL', CLAIMS, id)
  redis.call('HDEL', ATTEMPTS, id)
  redis.call('HDEL', TASKS, id)
  return 1
end
if ARGV[1] == 'release' then
  requeue(id, ARGV[4], false)
  return 1
end
local deadline = now_ms() + tonumber(ARGV[4])
redis.call('ZADD', IN_FLIGHT, 'XX', deadline, id)
return deadline
