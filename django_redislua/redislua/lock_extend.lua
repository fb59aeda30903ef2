-- Extend a lease if, and only if, the caller holds it: a lock, a run_once run or a
-- single_flight build (each a hash whose `owner` field names the holder). A lock hand-off that
-- its heir has not confirmed yet cannot be extended.
--
-- KEYS[1]  the hash {owner, ...[, claim]}.
-- ARGV[1]  the owner token.
-- ARGV[2]  milliseconds (integer >= 1).
-- ARGV[3]  "add": add ARGV[2] to the lease left; "replace": the lease becomes ARGV[2].
--
-- Returns the new lease in milliseconds, or -1 when the caller does not hold it.

local state = redis.call('HMGET', KEYS[1], 'owner', 'claim')
if state[1] ~= ARGV[1] or state[2] then
  return -1
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'add' then
  ttl = ttl + math.max(redis.call('PTTL', KEYS[1]), 0)
end
redis.call('PEXPIRE', KEYS[1], ttl)
return ttl
