-- Free a lock whoever holds it (an operator's action from the admin or redislua_locks): the
-- first live queued waiter is offered it, or every waiter is woken. The fencing counter is
-- kept, so later tokens still grow.
--
-- KEYS[1..4]  the lock, its fencing counter, its queue and the queue's stale times
--             (see lib/lock_queue.lua).
-- ARGV[1]  the wake-up channel (a PUBLISH target, not a key).
-- ARGV[2]  the lock's name as the application wrote it.
-- ARGV[3]  the claim window in milliseconds.
-- ARGV[4]  the inbox prefix (see lib/lock_queue.lua: where a hand-off is published).
--
-- Returns 1 when a held lock was freed, 0 when it was not held.

--#include lib/lock_queue.lua

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
free(ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4])
return 1
