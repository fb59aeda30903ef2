-- run_once: end the caller's run: store its result (with who ran it and when), or (on failure)
-- forget the run so a later call may try again; wake the duplicates waiting for it.
--
-- KEYS[1]  the record: a hash {state = "running" | "done", owner, by, started_at, finished_at,
--          result} (see once_begin).
-- ARGV[1]  the caller's run token.
-- ARGV[2]  "done" (store ARGV[3] for ARGV[4] ms) or "failed" (store nothing).
-- ARGV[3]  the serialized result (ignored when failed).
-- ARGV[4]  how long the result is kept, in milliseconds (integer >= 1).
-- ARGV[5]  the channel duplicates subscribe to (a PUBLISH target, not a key).
-- ARGV[6]  who ran it ("<host>:<pid>"), kept in the done record.
-- ARGV[7]  when the run began (ms, server clock, from once_begin), kept in the done record.
--
-- Returns {code, now (ms, server clock)}: code 1 when the caller still held its running lease;
-- 2 when the lease had run out but no other run started since (a result is then stored all
-- the same: the handler ran once); 0 when another run took the key over (it is left alone:
-- the handler may have run twice).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'state', 'owner')
local held = state[2] == ARGV[1]
if not held and state[1] then
  return {0, now}
end
if ARGV[2] == 'done' then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[3], 'by', ARGV[6],
             'started_at', ARGV[7], 'finished_at', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
elseif held then
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[5], 'released')
if held then
  return {1, now}
end
return {2, now}
