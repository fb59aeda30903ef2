-- A kept rate (a block; see ratelimit.lua, "Kept rates"): the record of the rate a policy's rate
-- callable gave, written beside the identity's state once a decision consumed (wrote the state),
-- so the admin can peek at that state with the numbers it was decided with. The includer
-- declares the locals key (the state key, just written), rate_key (the key keeping the rate:
-- a KEYS entry, the state's hash tag) and rate_record. It expires with the state: the state's
-- PTTL read after the write, then SET PX that, so never before the state (the server's clock
-- stands still within a script on Redis 7, and only moves on between the two before). A state
-- without an expiry (none is written without one) keeps no record.
local ttl = redis.call('PTTL', key)
if ttl > 0 then redis.call('SET', rate_key, rate_record, 'PX', ttl) end
