-- WorkQueue.stats: the queue's sizes. Writes nothing.
--
-- KEYS[1..7]  the queue's keys (see lib/queue_keys.lua).
-- ARGV        none.
--
-- Returns {pending, in flight, of which past their deadline, dead}.
--#include lib/queue_keys.lua

return {
  redis.call('LLEN', PENDING),
  redis.call('ZCARD', IN_FLIGHT),
  redis.call('ZCOUNT', IN_FLIGHT, '-inf', now_ms()),
  redis.call('HLEN', DEAD),
}
