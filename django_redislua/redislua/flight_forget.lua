-- single_flight: forget a cached value (an invalidation). A build running now is marked so
-- that its end stores nothing: what it built may predate the invalidation. It keeps its lease
-- (no second build runs beside it), and when it ends its waiters wake and one builds anew.
--
-- KEYS[1]  the cached value: a hash {value, fresh_until[, version]}.
-- KEYS[2]  the build lease: a hash {owner[, forgotten]}.
-- KEYS[3]  the last failed build (a record for that build's waiters): deleted.
-- ARGV     none.
--
-- Returns 1 when a value (fresh or stale) was cached, else 0.

local existed = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[3])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'forgotten', '1')
end
return existed
