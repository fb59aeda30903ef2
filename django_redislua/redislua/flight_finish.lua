-- single_flight: store what the builder built (or, on failure, only give up the lease) and wake
-- the callers waiting for it, if, and only if, the caller still holds the build lease: a
-- builder whose lease ran out must not overwrite what a later builder stored.
--
-- KEYS[1]  the cached value: a hash {value, fresh_until (ms, server clock)}.
-- KEYS[2]  the build lease: a hash {owner = the builder's token}.
-- ARGV[1]  the builder's token.
-- ARGV[2]  "store" or "failed".
-- ARGV[3]  the serialized value (ignored when failed).
-- ARGV[4]  how long the value is fresh, in milliseconds (integer >= 1).
-- ARGV[5]  how long a stale copy is kept after that, in milliseconds (integer >= 0).
-- ARGV[6]  the channel waiters subscribe to (a PUBLISH target, not a key).
-- ARGV[7]  VersionedCache: the version the builder saw when it began (the value is stored under
--          it, and only when no newer version was stored meanwhile); "" for single_flight.
--
-- Returns 1, or 0 when the caller no longer held the build lease (nothing was changed), or 2
-- when a newer version was stored while it built (the lease is given up, the value not stored).

if redis.call('HGET', KEYS[2], 'owner') ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'store' and ARGV[7] ~= '' then
  local stored = tonumber(redis.call('HGET', KEYS[1], 'version'))
  if stored and stored > tonumber(ARGV[7]) then
    redis.call('DEL', KEYS[2])
    redis.call('PUBLISH', ARGV[6], 'released')
    return 2
  end
  redis.call('HSET', KEYS[1], 'version', ARGV[7])
end
if ARGV[2] == 'store' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local fresh = tonumber(ARGV[4])
  redis.call('HSET', KEYS[1], 'value', ARGV[3], 'fresh_until', now + fresh)
  redis.call('PEXPIRE', KEYS[1], fresh + tonumber(ARGV[5]))
end
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[6], 'released')
return 1
