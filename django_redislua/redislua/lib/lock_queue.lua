-- The waiter queue and hand-off of a lock (a fragment: the including script names its KEYS and
-- ARGV). Every lock script that includes it is called with the same four keys:
--
-- KEYS[1]  the lock: a hash {owner, wait, count, token, name[, claim][, e:<wait>...]} expiring
--          with the lease; an "e:<wait>" field per re-entry held (see lock_acquire.lua).
--          `wait` is the id of the acquire call that took it (grants belong to one wait, never
--          to a Lock object), '' once that first hold was given back while re-entries made on
--          it still hold the lock; `count` is the holds left: the first one and the re-entries;
--          `claim` marks a hand-off its heir has not confirmed yet, and the hash then expires
--          after the claim window instead of the lease.
-- KEYS[2]  the fencing counter: the last token handed out. It expires FENCE_KEEP_MS after the
--          lease it was taken for; tokens stay increasing without it (see next_token).
-- KEYS[3]  the queue: a sorted set of waits, member "<wait>[.<inbox>]:<owner>:<lease ms>", score =
--          arrival (server clock, microseconds). First come, first served. <inbox>: the token of
--          the waiter's own channel, "<inbox prefix><inbox>", where its hand-off is published
--          (without one, on the lock's channel, which every waiter of the lock hears).
-- KEYS[4]  the same members scored by when the registration goes stale (server clock, ms): a
--          waiter that died without withdrawing is dropped then, and never handed the lock.
--          Also "x:<wait>" members: waits withdrawn by an interrupted caller (see tombstone).

-- How long the fencing counter outlives the lease it was taken for. Within it, tokens stay
-- increasing even if the server clock steps back; after it, the clock alone orders them.
local FENCE_KEEP_MS = 600000
-- Stale registrations dropped per call, at most: no unbounded loop even for a huge queue.
local PRUNE_LIMIT = 100

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(n)
  return string.format('%d', n)
end

-- The next fencing token: above the last one while the counter lives, and never below the
-- server clock in microseconds, so a restart without persistence, a flush or an eviction of
-- the counter cannot send tokens back (unless the server clock itself goes back).
-- LAST: the last token, when the caller knows it (a release: the hold it frees had it, and no
-- token can have been handed out since); else it is read from the counter.
local function next_token(now, lease_ms, last)
  last = last or tonumber(redis.call('GET', KEYS[2]) or '0')
  local token = math.max(last + 1, now)
  redis.call('SET', KEYS[2], int(token), 'PX', int(lease_ms + FENCE_KEEP_MS))
  return token
end

-- KEYS[1] must not exist (every caller checked or deleted it), or hold only the fields written
-- here (a released hold's: they are overwritten). With CLAIM_MS, the lock is offered (a hand-off
-- its heir must confirm): marked `claim`, it expires after CLAIM_MS. LAST: see next_token.
local function take(now, owner, wait, lease_ms, name, claim_ms, last)
  local token = next_token(now, lease_ms, last)
  if claim_ms then
    redis.call('HSET', KEYS[1], 'owner', owner, 'wait', wait, 'count', 1, 'token', int(token),
               'name', name, 'claim', 1)
  else
    redis.call('HSET', KEYS[1], 'owner', owner, 'wait', wait, 'count', 1, 'token', int(token),
               'name', name)
  end
  redis.call('PEXPIRE', KEYS[1], claim_ms or lease_ms)
  return token
end

-- The queue member of a wait (see KEYS[3]).
local function member_of(wait, owner, lease, inbox)
  if inbox ~= nil and inbox ~= '' then
    wait = wait .. '.' .. inbox
  end
  return wait .. ':' .. owner .. ':' .. lease
end

local function leave(member)
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
end

-- Drop the registrations and tombstones whose time ran out, at most PRUNE_LIMIT of them.
local function prune_stale(now)
  local stale = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', int(math.floor(now / 1000)),
                           'LIMIT', 0, PRUNE_LIMIT)
  for _, member in ipairs(stale) do
    leave(member)
  end
end

-- How long a wait withdrawn by an interrupted caller ("give") is refused: its acquire may still be
-- on its way to the server (sent just before a timeout or a cancellation, behind a busy script:
-- the server answers other clients BUSY after lua-time-limit, 5 s by default), and must not take
-- or re-enter the lock after the withdrawal gave back whatever it held.
local TOMBSTONE_MS = 60000

-- Refuse the waits WAITS (a list of wait ids) from now on, for TOMBSTONE_MS.
local function tombstone(now, waits)
  -- Tombstones (and stale registrations) that ran out are dropped here, where some are added,
  -- and when a stale registration comes first in the queue (next_heir): the set stays bounded
  -- by the withdrawals of the last minute even on a lock that is never idle.
  prune_stale(now)
  local until_ms = int(math.floor(now / 1000) + TOMBSTONE_MS)
  for _, wait in ipairs(waits) do
    redis.call('ZADD', KEYS[4], until_ms, 'x:' .. wait)
  end
  if redis.call('PTTL', KEYS[4]) < TOMBSTONE_MS + 1000 then
    redis.call('PEXPIRE', KEYS[4], TOMBSTONE_MS + 1000)
  end
end

local function withdrawn(wait)
  return redis.call('ZSCORE', KEYS[4], 'x:' .. wait) ~= false
end

-- Give back the hold that wait WAIT made on a lock its owner holds (the caller checked the
-- owner): the first hold, when FIRST (the hash's `wait` field as last read or returned here)
-- names it, or a re-entry (its "e:<wait>" field). Returns 1 and the first hold's wait after it
-- ('' once that one is given back), or 0 and FIRST when WAIT holds nothing here (it never
-- took the lock, or was given back already: the same give-back sent again changes nothing).
-- The caller takes the 1 off `count`.
local function give_back(wait, first)
  if wait == '' then
    return 0, first
  end
  if wait == first then
    redis.call('HSET', KEYS[1], 'wait', '')
    return 1, ''
  end
  return redis.call('HDEL', KEYS[1], 'e:' .. wait), first
end

-- Queue MEMBER (if new: a retry keeps its place) and keep it fresh for STAY_MS.
local function enqueue(now, member, stay_ms)
  redis.call('ZADD', KEYS[3], 'NX', int(now), member)
  local stale_at = math.floor(now / 1000) + stay_ms
  redis.call('ZADD', KEYS[4], int(stale_at), member)
  -- Both sets outlive their freshest registration by a second, never forever.
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < stay_ms + 1000 then
      redis.call('PEXPIRE', KEYS[i], stay_ms + 1000)
    end
  end
end

-- The first live waiter, taken off the queue, and the server clock (us) it was read at; nil
-- when nobody waits. A registration gone stale (its waiter died without withdrawing) is dropped,
-- with up to PRUNE_LIMIT more, and the next one looked at: at most three, bounded work; live
-- waiters behind more stale ones than that retry within a claim window and find the lock free.
local function next_heir(now)
  for _ = 1, 3 do
    local head = redis.call('ZPOPMIN', KEYS[3])[1]
    if not head then
      return nil
    end
    now = now or now_us()
    local stale_at = redis.call('ZSCORE', KEYS[4], head)
    redis.call('ZREM', KEYS[4], head)
    if not stale_at or tonumber(stale_at) > math.floor(now / 1000) then
      return head, now
    end
    prune_stale(now)
  end
  return nil
end

-- The lock is free: offer it to the first live waiter as a claim it must confirm within
-- WINDOW_MS, and say so ("granted <wait> <token> <window ms>") on its inbox, INBOXES .. <inbox>
-- (only the heir wakes), or on CHANNEL when it named none. Returns false when nobody waits
-- (the caller then publishes "released"). NOW: the server clock if read already; LAST: see
-- next_token.
local function hand_off(now, channel, name, window_ms, inboxes, last)
  local head
  head, now = next_heir(now)
  if not head then
    return false
  end
  local first, owner, lease = string.match(head, '^([^:]*):([^:]*):(%d+)$')
  local wait, inbox = string.match(first, '^([^.]*)%.?(.*)$')
  local token = take(now, owner, wait, tonumber(lease), name, window_ms, last)
  if inbox ~= '' and inboxes ~= nil and inboxes ~= '' then
    channel = inboxes .. inbox
  end
  redis.call('PUBLISH', channel, 'granted ' .. wait .. ' ' .. int(token) .. ' ' .. window_ms)
  return true
end

-- Free the lock and offer it on. RELEASED: the token of the hold a release frees, when the hash
-- holds nothing but that hold's own fields (count 0: no re-entry's field is left); a heir's
-- fields then overwrite them, and the fencing counter need not be read. Otherwise (nil) the
-- hash is deleted first.
local function free(channel, name, window_ms, inboxes, released)
  if released == nil then
    redis.call('DEL', KEYS[1])
  end
  if not hand_off(nil, channel, name, window_ms, inboxes, released) then
    if released ~= nil then
      redis.call('DEL', KEYS[1])
    end
    redis.call('PUBLISH', channel, 'released')
  end
end
