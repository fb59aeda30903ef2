-- single_flight: read a cached value, or claim the right to build it (one builder at a time),
-- or, for a caller already waiting, learn that a build failed since it began waiting.
--
-- KEYS[1]  the cached value: a hash {value, fresh_until (ms, server clock), version (only
--          VersionedCache's entries)}.
-- KEYS[2]  the build lease: a hash {owner = the builder's token[, forgotten = "1"]},
--          expiring after the lease (the builder renews it while it builds).
-- KEYS[3]  the last failed build: a hash {at = when it failed (microseconds, server clock),
--          error (the exception's class), message}, kept for that build's waiters.
-- ARGV[1]  the caller's token (random, 32 hex characters).
-- ARGV[2]  the build lease in milliseconds (integer >= 1).
-- ARGV[3]  "" for a caller that has not waited; else when it began waiting (microseconds,
--          server clock, from this script's reply {3, ...}): a build that failed after that
--          moment is this caller's outcome too.
--
-- Returns {1, value, version} for a fresh value; {4, error, message} when a build failed since
-- the caller began waiting; {2, value, version} for a stale value while someone rebuilds it;
-- {3, milliseconds left of the build lease, now (microseconds, server clock)} when someone
-- builds and there is no value to serve; {0, "", version} when the caller must build (it now
-- holds the lease). The version is "" when the entry has none.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- In microseconds, as text: a number this large would be printed in exponent form.
local now_us = t[1] .. string.format('%06d', tonumber(t[2]))
local cached = redis.call('HMGET', KEYS[1], 'value', 'fresh_until', 'version')
local version = cached[3] or ''
if cached[1] and tonumber(cached[2]) > now then
  return {1, cached[1], version}
end
if ARGV[3] ~= '' then
  local failed = redis.call('HMGET', KEYS[3], 'at', 'error', 'message')
  if failed[1] and tonumber(failed[1]) > tonumber(ARGV[3]) then
    return {4, failed[2], failed[3]}
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  if cached[1] then
    return {2, cached[1], version}
  end
  return {3, redis.call('PTTL', KEYS[2]), now_us}
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {0, '', version}
