-- Rate-limit decision for one token_bucket policy ("tb"): KEYS and ARGV as ratelimit.lua's with
-- one policy (KEYS[1] its state key; ARGV[1] "hit", "peek" or "soft"; ARGV[2] "" (TIME), "+N"
-- (TIME plus N us) or the time; ARGV[3..8] the policy's six). The engine sends a single check
-- here. Flat: an EVALSHA re-creates every function a script defines on each call, so the
-- algorithm is inlined as a block between the single-policy start and end.
--#per-call
if ARGV[3] ~= 'tb' then
  return redis.error_reply('ERR redislua: unknown algorithm ' .. tostring(ARGV[3]) .. ' for tb')
end
--#include lib/single_begin.lua
--#include lib/token_bucket.lua
--#include lib/single_end.lua
