-- WorkQueue.put: append a task, unless the queue holds MAX_LENGTH tasks already.
--
-- KEYS[1..7]  the queue's keys (see lib/queue_keys.lua).
-- ARGV[1]     the payload (JSON text).
-- ARGV[2]     the most tasks the queue holds, pending and in flight (integer >= 1), or "".
--
-- Returns the new task's id, or 0 when the queue is full (nothing added).
--#include lib/queue_keys.lua

if ARGV[2] ~= '' and redis.call('HLEN', TASKS) >= tonumber(ARGV[2]) then
  return 0
end
local id = redis.call('INCR', SEQUENCE)
redis.call('HSET', TASKS, id, ARGV[1])
redis.call('RPUSH', PENDING, id)
return id
