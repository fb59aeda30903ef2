-- Confirm a hand-off: the lock was offered to this wait (lock_release published "granted" to
-- its inbox), and its heir is alive to take it, so the lease starts now. One key, no queue
-- work: the short path between a release and its heir running (lock_acquire does the same,
-- and more, for a heir that comes back by itself).
--
-- KEYS[1]  the lock (see lib/lock_queue.lua).
-- ARGV[1]  the owner token.
-- ARGV[2]  the wait id the grant named.
-- ARGV[3]  the lease in milliseconds (integer >= 1).
--
-- Returns {1, fencing token, re-entry count} when the lock is this wait's (confirmed now, or
-- earlier: a confirm sent again after a lost reply changes nothing); {0, milliseconds until the
-- lock may change hands (-1: no expiry, -2: free), 0} when the claim ran out first.

local state = redis.call('HMGET', KEYS[1], 'owner', 'wait', 'count', 'token', 'claim')
if state[1] ~= ARGV[1] or state[2] ~= ARGV[2] then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
if state[5] then
  redis.call('HDEL', KEYS[1], 'claim')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, tonumber(state[4]), tonumber(state[3])}
