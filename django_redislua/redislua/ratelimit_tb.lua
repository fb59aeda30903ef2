-- Rate-limit decision for one token_bucket policy ("tb"): KEYS and ARGV as ratelimit.lua's with
-- one policy (KEYS[1] its state key; ARGV[1] "hit" or "peek"; ARGV[2] "" (TIME), "+N" (TIME plus N
-- us) or the time; ARGV[3..8] the policy's six). The engine sends a single check here: a script
-- re-creates every function it defines on each EVALSHA, so this one defines only what token_bucket
-- needs.
local ALGORITHMS = {}
--#include lib/common.lua
--#include lib/token_bucket.lua
--#include lib/decide_one.lua
--#per-call
return decide_one(KEYS, ARGV)
