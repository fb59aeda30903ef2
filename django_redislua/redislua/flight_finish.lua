-- single_flight: store what the builder built (or, when it failed, record the failure for the
-- callers waiting on it) and wake them, if, and only if, the caller still holds the build
-- lease: a builder whose lease ran out must not overwrite what a later builder stored.
--
-- KEYS[1]  the cached value: a hash {value, fresh_until (ms, server clock)[, version]}.
-- KEYS[2]  the build lease: a hash {owner = the builder's token[, forgotten = "1"]}; a lease
--          marked forgotten (flight_forget ran while it built) stores and records nothing.
-- KEYS[3]  the last failed build: a hash {at (microseconds, server clock), error, message}.
-- ARGV[1]  the builder's token.
-- ARGV[2]  "store" (the value built), "failed" (the build raised: record it for the callers
--          waiting now) or "released" (give the lease back, record nothing: the build was
--          cancelled, or a caller gives back a lease it may have taken unknowingly).
-- ARGV[3]  "store": the serialized value; "failed": the exception's class; else ignored.
-- ARGV[4]  how long the value is fresh, in milliseconds (integer >= 1).
-- ARGV[5]  how long a stale copy is kept after that, in milliseconds (integer >= 0).
-- ARGV[6]  the channel waiters subscribe to (a PUBLISH target, not a key).
-- ARGV[7]  VersionedCache: the version the builder saw when it began (the value is stored under
--          it, and only when no newer version was stored meanwhile); "" for single_flight.
-- ARGV[8]  "failed": the exception's message (bounded by the caller); else ignored.
-- ARGV[9]  "failed": how long the failure is kept for late-waking waiters, in milliseconds
--          (integer >= 1: the build lease, past which a waiter would have woken anyway).
--
-- Returns 1, or 0 when the caller no longer held the build lease (nothing was changed), or 2
-- when a newer version was stored while it built (the lease is given up, the value not
-- stored), or 3 when the entry was forgotten while it built (nothing stored or recorded).

if redis.call('HGET', KEYS[2], 'owner') ~= ARGV[1] then
  return 0
end
local code = 1
if redis.call('HGET', KEYS[2], 'forgotten') then
  code = 3
elseif ARGV[2] == 'store' then
  local stored = ARGV[7] ~= '' and tonumber(redis.call('HGET', KEYS[1], 'version'))
  if stored and stored > tonumber(ARGV[7]) then
    code = 2
  else
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local fresh = tonumber(ARGV[4])
    if ARGV[7] ~= '' then
      redis.call('HSET', KEYS[1], 'version', ARGV[7])
    end
    redis.call('HSET', KEYS[1], 'value', ARGV[3], 'fresh_until', now + fresh)
    redis.call('PEXPIRE', KEYS[1], fresh + tonumber(ARGV[5]))
    redis.call('DEL', KEYS[3])
  end
elseif ARGV[2] == 'failed' then
  local t = redis.call('TIME')
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'at', t[1] .. string.format('%06d', tonumber(t[2])),
             'error', ARGV[3], 'message', ARGV[8])
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
end
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[6], 'released')
return code
