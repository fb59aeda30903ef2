-- The recipes' reset: delete every key given (one hash tag, so one slot).
--
-- KEYS     the keys of one recipe instance.
-- ARGV     none.
--
-- Returns how many of the keys existed.

return redis.call('DEL', unpack(KEYS))
