-- Set a live override of one policy (or "*": every policy) for one identity (see
-- django_redislua/overrides.py and lib/override.lua, which the decision scripts read it with).
--
-- KEYS[1]  the identity's override hash ("<KEY_PREFIX>:ov:{<identity>}").
-- ARGV[1]  the field: the policy's name, or "*".
-- ARGV[2]  the value without its end: "b" (block), "a" (allow) or "r|CODE|LIMIT|PARAM|EXTRA".
-- ARGV[3]  how long it lasts, integer microseconds (at least 1000).
-- ARGV[4]  its metadata (JSON: identity, rate, reason, created_by, created_at), kept in the
--          field "m:" .. ARGV[1] for the admin; the decision scripts never read it.
-- ARGV[5]  "now" as lib/clock.lua reads it ("" TIME, "+N" TIME shifted by a test, or a time).
--
-- Returns the end, server time in microseconds, as a string. The hash lives until its latest
-- override ends (a replaced longer one may keep it a while: its fields have ended by then).
local now = ARGV[5]
--#include lib/clock.lua
local ttl = tonumber(ARGV[3])
local ends = string.format('%.0f', now + ttl)
local kind, rest = string.match(ARGV[2], '^([ab])$')
if not kind then kind, rest = string.match(ARGV[2], '^(r)(|%a%a|%d+|%d+|.*)$') end
if not kind then return redis.error_reply('ERR redislua: bad override ' .. ARGV[2]) end
redis.call('HSET', KEYS[1], ARGV[1], kind .. '|' .. ends .. (rest or ''), 'm:' .. ARGV[1], ARGV[4])
-- At least 1 s: an ended field is ignored anyway, and a test that injects time must be able
-- to keep the key (PERSIST) before real time expires a very short one.
local wanted = math.max(1000, math.ceil(ttl / 1000))
if redis.call('PTTL', KEYS[1]) < wanted then redis.call('PEXPIRE', KEYS[1], wanted) end
return ends
