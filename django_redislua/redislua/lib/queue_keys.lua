-- The keys every WorkQueue script is given (a fragment), one hash tag (the queue's name):
--
-- KEYS[1]  pending: a list of task ids, claimed from the left.
-- KEYS[2]  tasks: a hash {task id = payload} of every task not yet acknowledged or dead.
-- KEYS[3]  in flight: a sorted set {task id: deadline (ms, server clock)} of claimed tasks.
-- KEYS[4]  claims: a hash {task id = token of the claim that holds it}.
-- KEYS[5]  attempts: a hash {task id = times claimed}.
-- KEYS[6]  dead: a hash {task id = payload} of tasks that used up their attempts.
-- KEYS[7]  the id sequence: a counter.
local PENDING, TASKS, IN_FLIGHT, CLAIMS, ATTEMPTS, DEAD, SEQUENCE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

-- How many expired claims one call returns to the queue: a bound on the script's work; the
-- next calls return the rest.
local RECLAIM_BATCH = 100

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A task whose claim ended without an ack goes back to the front of the queue, or, when it
-- was claimed MAX_ATTEMPTS times already ("" for no limit), to the dead tasks.
local function requeue(id, max_attempts, front)
  redis.call('ZREM', IN_FLIGHT, id)
  redis.call('HDEL', CLAIMS, id)
  local attempts = tonumber(redis.call('HGET', ATTEMPTS, id)) or 0
  if max_attempts ~= '' and attempts >= tonumber(max_attempts) then
    local payload = redis.call('HGET', TASKS, id)
    if payload then
      redis.call('HSET', DEAD, id, payload)
    end
    redis.call('HDEL', TASKS, id)
    redis.call('HDEL', ATTEMPTS, id)
    return
  end
  if front then
    redis.call('LPUSH', PENDING, id)
  else
    redis.call('RPUSH', PENDING, id)
  end
end

-- Requeue the claims whose deadline passed (at most RECLAIM_BATCH of them); their number.
local function reclaim_expired(now, max_attempts)
  local expired = redis.call('ZRANGEBYSCORE', IN_FLIGHT, '-inf', now, 'LIMIT', 0, RECLAIM_BATCH)
  for i = #expired, 1, -1 do -- the oldest ends up in front
    requeue(expired[i], max_attempts, true)
  end
  return #expired
end
