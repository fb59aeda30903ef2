-- Clear the live override of one policy (or "*") for one identity (see
-- django_redislua/overrides.py).
--
-- KEYS[1]  the identity's override hash.
-- ARGV[1]  the field: the policy's name, or "*".
--
-- Returns 1 when there was one (ended or not), else 0. The hash goes with its last field.
return redis.call('HDEL', KEYS[1], ARGV[1], 'm:' .. ARGV[1]) > 0 and 1 or 0
