-- singleton: a run turned away because another holds the singleton asks for one more run
-- after it (singleton_rerun). The holder reads the request when it finishes (after its
-- release), so the request and the check of the lock are one step: a holder that has
-- released already leaves the lock free here, and the caller takes it and runs itself.
--
-- KEYS[1]  the singleton's lock hash (rl:lock:{name}), present while a run holds it.
-- KEYS[2]  the rerun request (rl:lock:{name}:rerun): the latest turned-away run's arguments.
-- ARGV[1]  those arguments, serialized (a token inside makes each request unique).
-- ARGV[2]  how long the request is kept, in milliseconds (integer >= 1).
--
-- Returns 1 when the request is left for the holder, 0 when the lock is free (nothing set).

if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
