-- run_once: claim the right to run a handler for one key, or read the result stored by the run
-- that already finished, or who runs it now.
--
-- KEYS[1]  the record: a hash {state = "running" | "done", owner (the running call's token),
--          by (who runs or ran it: "<host>:<pid>"), started_at, finished_at (ms, server
--          clock), result}. A record written by an earlier version has only state, owner and
--          result: the other fields read as "".
-- ARGV[1]  the caller's run token (random, 32 hex characters).
-- ARGV[2]  the running lease in milliseconds: a crashed run frees the key after it.
-- ARGV[3]  who the caller is ("<host>:<pid>", at most ~110 characters), kept in the record.
--
-- Returns {0, "", now} when the caller must run the handler (it now owns the running lease;
-- now = when its run began, ms, server clock); {1, milliseconds left of the running lease, by,
-- started_at, now} when another run is in progress; {2, the stored result, by, finished_at,
-- started_at} when a run already finished.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local record = redis.call('HMGET', KEYS[1], 'state', 'result', 'by', 'started_at', 'finished_at')
local by, started_at = record[3] or '', record[4] or ''
if record[1] == 'done' then
  return {2, record[2], by, record[5] or '', started_at}
end
if record[1] == 'running' then
  return {1, redis.call('PTTL', KEYS[1]), by, started_at, now}
end
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[1], 'by', ARGV[3],
           'started_at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {0, '', now}
