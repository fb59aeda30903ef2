-- singleton: a finished run claims the rerun request it has just read (singleton_rerun), before
-- it sends the job again: the rerun, however quick, never finds it a second time. A request
-- replaced meanwhile (a newer holder turned a run away) is left to that holder.
--
-- KEYS[1]  the rerun request (rl:lock:{name}:rerun).
-- ARGV[1]  the request as the finished run read it.
--
-- Returns 1 when it was claimed (deleted), 0 when it had changed (or was gone).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
