-- Inventory.give_back: return an order's units to the stock, exactly once (a refund), and free
-- its user to order again.
--
-- KEYS[1]  the stock: a hash {left = units left, sold = units held by orders}.
-- KEYS[2]  the orders: a hash {order id = "<qty>[ <user id>]", "r" in front once given back}.
-- KEYS[3]  the buyers: a hash {user id = how many of the user's orders hold units}.
-- ARGV[1]  the order id.
--
-- Returns {ok, reason, units left}: {1, "ok", left} when given back; {0, "already_given_back",
-- left}; {0, "unknown_order", left} when no order took units under that id.

local left = tonumber(redis.call('HGET', KEYS[1], 'left')) or 0
local order = redis.call('HGET', KEYS[2], ARGV[1])
if not order then
  return {0, 'unknown_order', left}
end
if string.sub(order, 1, 1) == 'r' then
  return {0, 'already_given_back', left}
end
local space = string.find(order, ' ', 1, true)
local qty = tonumber(space and string.sub(order, 1, space - 1) or order)
left = redis.call('HINCRBY', KEYS[1], 'left', qty)
redis.call('HINCRBY', KEYS[1], 'sold', -qty)
redis.call('HSET', KEYS[2], ARGV[1], 'r' .. order)
if space then
  local user = string.sub(order, space + 1)
  if redis.call('HINCRBY', KEYS[3], user, -1) <= 0 then
    redis.call('HDEL', KEYS[3], user)
  end
end
return {1, 'ok', left}
