-- Acquire a lock (SET NX PX semantics), re-enter it (reentrant mode), or confirm a hand-off made
-- to this wait; hand out a fencing token. A waiter already subscribed to the wake-up channel
-- queues itself here (first come, first served), so a release can hand the lock to it.
--
-- KEYS[1..4]  the lock, its fencing counter, its queue and the queue's stale times
--             (see lib/lock_queue.lua).
-- ARGV[1]  the owner token (random, 32 hex characters, held by the Lock object).
-- ARGV[2]  the wait id: random, one per acquire call.
-- ARGV[3]  the lease in milliseconds (integer >= 1).
-- ARGV[4]  "1": the owner may re-enter (reentrant mode); "0": a second acquire by the owner waits.
-- ARGV[5]  the lock's name as the application wrote it (shown by the admin and redislua_locks).
-- ARGV[6]  milliseconds the caller stays queued while the lock is held (0: a first try, not
--          subscribed yet, so not queued).
-- ARGV[7]  the wake-up channel (a PUBLISH target, not a key).
-- ARGV[8]  the claim window in milliseconds (how long a heir has to confirm a hand-off).
-- ARGV[9]  the inbox prefix: a waiter's inbox channel is this followed by its inbox token.
-- ARGV[10] this wait's inbox token ("": a hand-off to it is published on ARGV[7]).
-- ARGV[11...]  the wait ids of the owner's earlier acquire calls whose replies never arrived
--          (possibly none): settled first, as lock_release.lua does. A lost acquire that took
--          the lock and whose give-back never arrived then no longer stands in the way of the
--          same owner's next acquire (which would otherwise wait for its lease to run out).
--
-- A re-entry adds the field "e:<wait id>" (see below); the hash is bounded by the re-entries held.
--
-- Returns {1, fencing token, re-entry count} when acquired, re-entered or confirmed;
-- {0, milliseconds until the lock may change hands (lease or claim left; -1: no expiry), 0}.

--#include lib/lock_queue.lua

local owner, wait, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local stay, channel, window = tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local inboxes = ARGV[9] or ''
local member = member_of(wait, owner, ARGV[3], ARGV[10])
if withdrawn(wait) then
  -- This wait was withdrawn: its caller gave up on it, and nobody reads this reply.
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
local now = now_us()
local state = redis.call('HMGET', KEYS[1], 'owner', 'wait', 'count', 'token', 'claim')
if #ARGV > 10 then
  local uncounted = {}
  for i = 11, #ARGV do
    uncounted[#uncounted + 1] = ARGV[i]
  end
  tombstone(now, uncounted)
  if state[1] == owner then
    local count, first, given = tonumber(state[3]), state[2], 0
    for _, lost in ipairs(uncounted) do
      given, first = give_back(lost, first)
      count = count - given
    end
    if count <= 0 then
      redis.call('DEL', KEYS[1])  -- free: the flow below takes it or offers it on
    elseif count ~= tonumber(state[3]) then
      redis.call('HSET', KEYS[1], 'count', count)
    end
    state = redis.call('HMGET', KEYS[1], 'owner', 'wait', 'count', 'token', 'claim')
  end
end

if not state[1] then
  -- Free. A queued waiter coming back takes it (it is alive: it is asking). A caller that is not
  -- queued must not overtake those that are: the first live one is offered the lock instead.
  local queued = stay > 0 and redis.call('ZSCORE', KEYS[3], member)
  if queued or not hand_off(now, channel, ARGV[5], window, inboxes) then
    if queued then
      leave(member)
    end
    return {1, take(now, owner, wait, lease, ARGV[5]), 1}
  end
  state = redis.call('HMGET', KEYS[1], 'owner', 'wait', 'count', 'token', 'claim')
elseif state[1] == owner then
  if state[2] == wait then
    if state[5] then
      -- The hand-off made to this wait: confirmed, so the lease starts now.
      redis.call('HDEL', KEYS[1], 'claim')
      redis.call('PEXPIRE', KEYS[1], lease)
    end
    return {1, tonumber(state[4]), tonumber(state[3])}
  end
  if ARGV[4] == '1' and not state[5] then
    -- A re-entry is recorded under its wait id: released by that id (lock_release), and given
    -- back by it (lock_withdraw "give") when its caller never learned of it (a lost reply, a
    -- cancellation). The same wait cannot re-enter twice.
    if redis.call('HSETNX', KEYS[1], 'e:' .. wait, 1) == 0 then
      return {1, tonumber(state[4]), tonumber(state[3])}
    end
    local count = redis.call('HINCRBY', KEYS[1], 'count', 1)
    redis.call('PEXPIRE', KEYS[1], lease)
    return {1, tonumber(state[4]), count}
  end
end

if stay > 0 then
  enqueue(now, member, stay)
end
return {0, redis.call('PTTL', KEYS[1]), 0}
