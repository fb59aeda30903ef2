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
-- Returns 1, or 0 when the caller's running lease had expired (the record is left alone).

if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'done' then
  redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[3])
  redis.call('HDEL', KEYS[1], 'owner')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
else
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[5], 'released')
return 1
