-- Inventory.set / Inventory.add: set the units left of one SKU (only if none are set, with
-- "open"), or add to them (a restock); the orders already taken stay recorded.
--
-- KEYS[1]  the stock: a hash {left = units left, sold = units held by orders}.
-- KEYS[2]  the orders: a hash {order id = "<qty>[ <user id>]", "r" in front once given back}.
-- KEYS[3]  the buyers: a hash {user id = how many of the user's orders hold units}.
-- ARGV[1]  "set", "open" (set unless a stock is set: nothing changes then) or "add".
-- ARGV[2]  units (integer; >= 0 for "set" and "open", >= 1 for "add").
-- ARGV[3]  lifetime of the SKU's keys in milliseconds, or "" to keep them (and any lifetime
--          they already have).
--
-- Returns the units left, or {-1, units left} when "add" found no stock set (nothing changed).

local left
if ARGV[1] == 'open' and redis.call('HEXISTS', KEYS[1], 'left') == 1 then
  return tonumber(redis.call('HGET', KEYS[1], 'left'))
end
if ARGV[1] ~= 'add' then
  left = tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'left', left)
else
  if redis.call('HEXISTS', KEYS[1], 'left') == 0 then
    return {-1, 0}
  end
  left = redis.call('HINCRBY', KEYS[1], 'left', ARGV[2])
end
if ARGV[3] ~= '' then
  for i = 1, 3 do
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  end
end
return left
