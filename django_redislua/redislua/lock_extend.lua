-- Extend a lock's lease if, and only if, the caller owns it.
--
-- KEYS[1]  the lock hash {owner, count, token, name}.
-- ARGV[1]  the owner token.
-- ARGV[2]  milliseconds (integer >= 1).
-- ARGV[3]  "add": add ARGV[2] to the lease left; "replace": the lease becomes ARGV[2].
--
-- Returns the new lease in milliseconds, or -1 when the caller does not own the lock.

if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return -1
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  ttl = ttl + math.max(redis.call('PTTL', KEYS[1]), 0)
end
redis.call('PEXPIRE', KEYS[1], ttl)
return ttl
