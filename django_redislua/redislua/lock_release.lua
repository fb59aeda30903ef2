-- Release a lock if, and only if, the caller owns it. When it becomes free, offer it to the
-- first live queued waiter (a claim it must confirm within the claim window), or, with nobody
-- queued, wake every waiter.
--
-- A release also settles the owner's acquire calls whose replies never arrived (ARGV[9...]):
-- each may have taken or re-entered the lock on the server while its caller counts nothing,
-- and its give-back (lock_withdraw "give") may never have arrived. Each such hold is given back
-- here, and such a call that reaches the server later is refused. So once the holder has
-- released every hold it knows of, the lock is free, whatever was lost on the way.
--
-- KEYS[1..4]  the lock, its fencing counter, its queue and the queue's stale times
--             (see lib/lock_queue.lua).
-- ARGV[1]  the owner token.
-- ARGV[2]  "one": give back one hold (the lock stays held while holds are left); "all":
--          release fully.
-- ARGV[3]  the wake-up channel (a PUBLISH target, not a key).
-- ARGV[4]  the lock's name as the application wrote it.
-- ARGV[5]  the claim window in milliseconds.
-- ARGV[6]  a fencing token the lock must still carry, or "" for any: undoing an acquisition
--          whose reply was lost must not release a later one by the same owner.
-- ARGV[7]  with "one": the wait id of the hold given back (the acquire call that took the
--          lock, or a re-entry), or "" for the first hold. A hold is given back by its id, so
--          once only: a release sent again after its reply was lost (or one that arrives late,
--          behind a busy server) gives back nothing more, and never a hold made since.
-- ARGV[8]  the inbox prefix (see lib/lock_queue.lua: where a hand-off is published).
-- ARGV[9...]  the wait ids of the owner's acquire calls whose replies never arrived (possibly
--          none); as many as the caller has unsettled, each given back and refused from now on.
--
-- Publishes "granted <wait> <token> <window ms>" (to the heir's inbox) or "released".
-- Returns -1 when the caller does not own the lock (expired, taken, force-released), otherwise
-- the holds left (0 = released).

--#include lib/lock_queue.lua

if #ARGV > 8 then
  -- Refused even when the lock is not ours now: a late one must not take it either.
  local unanswered = {}
  for i = 9, #ARGV do
    unanswered[#unanswered + 1] = ARGV[i]
  end
  tombstone(now_us(), unanswered)
end
local state = redis.call('HMGET', KEYS[1], 'owner', 'token', 'claim', 'count', 'wait')
if state[1] ~= ARGV[1] or state[3] or (ARGV[6] ~= '' and state[2] ~= ARGV[6]) then
  return -1
end
if ARGV[2] == 'one' then
  local count, first, given = tonumber(state[4]), state[5], 0
  local hold = ARGV[7] or ''
  if hold == '' then
    hold = first
  end
  given, first = give_back(hold, first)
  count = count - given
  for i = 9, #ARGV do
    given, first = give_back(ARGV[i], first)
    count = count - given
  end
  if count > 0 then
    if count ~= tonumber(state[4]) then
      redis.call('HSET', KEYS[1], 'count', count)
    end
    return count
  end
  if redis.call('HLEN', KEYS[1]) ~= 5 then
    -- More fields than a bare hold's five: re-entries an older version's release counted off
    -- without deleting their fields. Deleted before a heir's fields are written.
    free(ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[8])
    return 0
  end
end
free(ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[8], tonumber(state[2]))
return 0
