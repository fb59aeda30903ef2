-- singleton: the request a finished run has just sent again (singleton_rerun) is deleted,
-- unless a newer one replaced it meanwhile: that one waits for the next run's end. Sent again
-- after a lost reply, it deletes nothing more.
--
-- KEYS[1]  the rerun request (rl:lock:{name}:rerun).
-- ARGV[1]  the request as the finished run read it.
--
-- Returns 1 when it was deleted, 0 when it had changed (or was gone).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
