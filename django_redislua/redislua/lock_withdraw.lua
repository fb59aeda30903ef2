-- A waiter leaves: its wait ended without the lock (timeout), or it was interrupted (an
-- exception, a cancellation, KeyboardInterrupt, a reply that never arrived). Either way it
-- leaves the queue. A hand-off made to this wait meanwhile is taken ("take": the wait ends with
-- the lock after all) or passed on to the next live waiter ("give": whoever was interrupted
-- will not use it); so is the hold this wait made ("give": the lock it took, which stays held
-- while the owner's later re-entries on it are held, or a re-entry it made), and an acquire of
-- this wait that reaches the server later is refused. Sending it again changes nothing more:
-- it is safe after a lost reply.
--
-- KEYS[1..4]  the lock, its fencing counter, its queue and the queue's stale times
--             (see lib/lock_queue.lua).
-- ARGV[1]  the owner token.
-- ARGV[2]  the wait id.
-- ARGV[3]  the lease in milliseconds (as queued).
-- ARGV[4]  "take" or "give".
-- ARGV[5]  the wake-up channel (a PUBLISH target, not a key).
-- ARGV[6]  the lock's name as the application wrote it.
-- ARGV[7]  the claim window in milliseconds.
-- ARGV[8]  the inbox prefix (see lib/lock_queue.lua: where a hand-off is published).
-- ARGV[9]  this wait's inbox token, as queued ("" for none).
--
-- Returns {1, fencing token, re-entry count} when the caller leaves holding the lock, else
-- {0, 0, 0}.

--#include lib/lock_queue.lua

leave(member_of(ARGV[2], ARGV[1], ARGV[3], ARGV[9]))
if ARGV[4] == 'give' then
  -- An interrupted caller: an acquire of this wait still on its way is refused when it comes.
  tombstone(now_us(), {ARGV[2]})
end
local state = redis.call('HMGET', KEYS[1], 'owner', 'wait', 'count', 'token', 'claim')
if state[1] ~= ARGV[1] then
  return {0, 0, 0}
end
if state[2] == ARGV[2] and ARGV[4] == 'take' then
  if state[5] then
    redis.call('HDEL', KEYS[1], 'claim')
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  return {1, tonumber(state[4]), tonumber(state[3])}
end
if ARGV[4] == 'give' then
  -- The hold this wait made is given back: the lock it took, or a re-entry it made on an
  -- earlier wait's hold. Re-entries later waits of the owner made on the lock this wait took
  -- keep it held (their caller holds it: the one hold given back is this wait's).
  local given = give_back(ARGV[2], state[2])
  if given == 1 and redis.call('HINCRBY', KEYS[1], 'count', -1) <= 0 then
    free(ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8])
  end
end
return {0, 0, 0}
