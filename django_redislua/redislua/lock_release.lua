-- Release a lock if, and only if, the caller owns it. When it becomes free, offer it to the
-- first live queued waiter (a claim it must confirm within the claim window), or, with nobody
-- queued, wake every waiter.
--
-- KEYS[1..4]  the lock, its fencing counter, its queue and the queue's stale times
--             (see lib/lock_queue.lua).
-- ARGV[1]  the owner token.
-- ARGV[2]  "one": leave one re-entry (the lock stays held while count > 0); "all": release fully.
-- ARGV[3]  the wake-up channel (a PUBLISH target, not a key).
-- ARGV[4]  the lock's name as the application wrote it.
-- ARGV[5]  the claim window in milliseconds.
-- ARGV[6]  a fencing token the lock must still carry, or "" for any: undoing an acquisition
--          whose reply was lost must not release a later one by the same owner.
-- ARGV[7]  with "one": the wait id of the re-entry given back, or "" for the first hold. A
--          re-entry already given back is not given back twice (a release sent again after
--          its reply was lost changes nothing).
-- ARGV[8]  the inbox prefix (see lib/lock_queue.lua: where a hand-off is published).
--
-- Publishes "granted <wait> <token> <window ms>" (to the heir's inbox) or "released".
-- Returns -1 when the caller does not own the lock (expired, taken, force-released), otherwise
-- the re-entries still held (0 = released).

--#include lib/lock_queue.lua

local state = redis.call('HMGET', KEYS[1], 'owner', 'token', 'claim', 'count')
if state[1] ~= ARGV[1] or state[3] or (ARGV[6] ~= '' and state[2] ~= ARGV[6]) then
  return -1
end
if ARGV[2] == 'one' then
  local hold = ARGV[7] or ''
  if hold ~= '' and redis.call('HDEL', KEYS[1], 'e:' .. hold) == 0 then
    return tonumber(state[4])
  end
  local count = redis.call('HINCRBY', KEYS[1], 'count', -1)
  if count > 0 then
    return count
  end
end
free(ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[8], tonumber(state[2]))
return 0
