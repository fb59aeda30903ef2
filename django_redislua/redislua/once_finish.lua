-- run_once: end the caller's run: store its result, or (on failure) forget the run so a later
-- call may try again; wake the duplicates waiting for it.
--
-- KEYS[1]  the record: a hash {state = "running" | "done", owner, result}.
-- ARGV[1]  the caller's run token.
-- ARGV[2]  "done" (store ARGV[3] for ARGV[4] ms) or "failed" (store nothing).
-- ARGV[3]  the serialized result (ignored when failed).
-- ARGV[4]  how long the result is kept, in milliseconds (integer >= 1).
-- ARGV[5]  the channel duplicates subscribe to (a PUBLISH target, not a key).
--
-- Returns 1 when the caller still held its running lease; 2 when the lease had run out but no
-- other run started since (a result is then stored all the same: the handler ran once); 0 when
-- another run took the key over (it is left alone: the handler may have run twice).

local state = redis.call('HMGET', KEYS[1], 'state', 'owner')
local held = state[2] == ARGV[1]
if not held and state[1] then
  return 0
end
if ARGV[2] == 'done' then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
elseif held then
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[5], 'released')
if held then
  return 1
end
return 2
