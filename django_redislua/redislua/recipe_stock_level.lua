-- Inventory.level: the units left of one SKU. Writes nothing.
--
-- KEYS[1]  the stock: a hash {left = units left, sold = units held by orders}.
-- ARGV     none.
--
-- Returns the units left, or nil when no stock is set.

return redis.call('HGET', KEYS[1], 'left')
