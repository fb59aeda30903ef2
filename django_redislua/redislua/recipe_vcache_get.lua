-- VersionedCache.get: the entry's value and version while it is fresh. Writes nothing.
--
-- KEYS[1]  the entry: a hash {value, version, fresh_until (ms, server clock)}.
-- ARGV     none.
--
-- Returns {value, version}, or {} when there is no fresh value.

local cached = redis.call('HMGET', KEYS[1], 'value', 'version', 'fresh_until')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not cached[1] or not cached[3] or tonumber(cached[3]) <= now then
  return {}
end
return {cached[1], cached[2] or ''}
