-- single_flight: read a cached value, or claim the right to build it (one builder at a time).
--
-- KEYS[1]  the cached value: a hash {value, fresh_until (ms, server clock), version (only
--          VersionedCache's entries)}.
-- KEYS[2]  the build lease: a hash {owner = the builder's token}, expiring after the lease (the
--          builder renews it while it builds).
-- ARGV[1]  the caller's token (random, 32 hex characters).
-- ARGV[2]  the build lease in milliseconds (integer >= 1).
--
-- Returns {1, value, version} for a fresh value; {2, value, version} for a stale value while
-- someone rebuilds it; {3, milliseconds left of the build lease} when someone builds and there
-- is no value to serve; {0, "", version} when the caller must build (it now holds the lease).
-- The version is "" when the entry has none.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cached = redis.call('HMGET', KEYS[1], 'value', 'fresh_until', 'version')
local version = cached[3] or ''
if cached[1] and tonumber(cached[2]) > now then
  return {1, cached[1], version}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  if cached[1] then
    return {2, cached[1], version}
  end
  return {3, redis.call('PTTL', KEYS[2])}
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {0, '', version}
