-- VersionedCache.set: store a value only when its version is newer than the stored one's.
--
-- KEYS[1]  the entry: a hash {value, version, fresh_until (ms, server clock)}, expiring when
--          it stops being fresh.
-- ARGV[1]  the version (integer, 0 <= version < 2^53).
-- ARGV[2]  the serialized value.
-- ARGV[3]  how long the value is fresh, in milliseconds (integer >= 1).
--
-- Returns {1, version} when stored, else {0, the stored version}.

local stored = tonumber(redis.call('HGET', KEYS[1], 'version'))
local version = tonumber(ARGV[1])
if stored and stored >= version then
  return {0, stored}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'version', ARGV[1],
           'fresh_until', now + tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, version}
