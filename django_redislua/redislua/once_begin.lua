-- run_once: claim the right to run a handler for one key, or read the result stored by the run
-- that already finished.
--
-- KEYS[1]  the record: a hash {state = "running" | "done", owner, result}.
-- ARGV[1]  the caller's run token (random, 32 hex characters).
-- ARGV[2]  the running lease in milliseconds: a crashed run frees the key after it.
--
-- Returns {0, ""} when the caller must run the handler (it now owns the running lease),
-- {1, milliseconds left of the running lease} when another run is in progress,
-- {2, the stored result} when a run already finished.

local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then
  return {2, redis.call('HGET', KEYS[1], 'result')}
end
if state == 'running' then
  return {1, redis.call('PTTL', KEYS[1])}
end
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {0, ''}
