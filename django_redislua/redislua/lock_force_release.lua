-- Delete a lock whoever holds it (an operator's action from the admin or redislua_locks) and
-- wake its waiters. The fencing counter is kept, so later tokens still grow.
--
-- KEYS[1]  the lock hash {owner, count, token, name}.
-- ARGV[1]  the channel waiters subscribe to (a PUBLISH target, not a key).
--
-- Returns 1 when a held lock was deleted, 0 when it was not held.

if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
redis.call('PUBLISH', ARGV[1], 'released')
return 1
