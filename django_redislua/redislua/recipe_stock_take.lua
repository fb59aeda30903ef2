-- Inventory.take: take QTY units for an order, once per order id (a retry takes nothing more),
-- never more than are left, and with ONE_PER_USER not for a user whose other order holds units.
--
-- KEYS[1]  the stock: a hash {left = units left, sold = units held by orders}.
-- KEYS[2]  the orders: a hash {order id = "<qty>[ <user id>]", "r" in front once given back}.
-- KEYS[3]  the buyers: a hash {user id = how many of the user's orders hold units}.
-- ARGV[1]  units to take (integer >= 1).
-- ARGV[2]  the order id (bounded, no spaces).
-- ARGV[3]  the user id (bounded, no spaces), or "".
-- ARGV[4]  "1": one order holding units per user; "0": any number.
--
-- Returns {ok, reason, units left}: {1, "ok", left} when taken; {1, "duplicate_order", left}
-- when this order already holds its units (nothing more taken); {0, "duplicate_order", left}
-- when this order was given back (an order id is used once); {0, "duplicate_user", left};
-- {0, "insufficient", left}. The orders and buyers keys take the stock's lifetime, if it has one.

local left = tonumber(redis.call('HGET', KEYS[1], 'left')) or 0
local order = redis.call('HGET', KEYS[2], ARGV[2])
if order then
  if string.sub(order, 1, 1) == 'r' then
    return {0, 'duplicate_order', left}
  end
  return {1, 'duplicate_order', left}
end
local user, qty = ARGV[3], tonumber(ARGV[1])
if user ~= '' and ARGV[4] == '1' and redis.call('HEXISTS', KEYS[3], user) == 1 then
  -- Any order of the user holding units, taken with one_per_user or not.
  return {0, 'duplicate_user', left}
end
if left < qty then
  return {0, 'insufficient', left}
end
left = redis.call('HINCRBY', KEYS[1], 'left', -qty)
redis.call('HINCRBY', KEYS[1], 'sold', qty)
if user ~= '' then
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[1] .. ' ' .. user)
  redis.call('HINCRBY', KEYS[3], user, 1)
else
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return {1, 'ok', left}
