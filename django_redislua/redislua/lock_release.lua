-- Release a lock if, and only if, the caller owns it; wake the waiters when it becomes free.
--
-- KEYS[1]  the lock hash {owner, count, token, name}.
-- ARGV[1]  the owner token.
-- ARGV[2]  "one": leave one re-entry (the lock stays held while count > 0); "all": release fully.
-- ARGV[3]  the channel waiters subscribe to (a PUBLISH target, not a key).
--
-- Returns -1 when the caller does not own the lock (expired, taken, force-released), otherwise
-- the re-entries still held (0 = released and waiters woken).

if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return -1
end
if ARGV[2] == 'one' then
  local count = redis.call('HINCRBY', KEYS[1], 'count', -1)
  if count > 0 then
    return count
  end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], 'released')
return 0
