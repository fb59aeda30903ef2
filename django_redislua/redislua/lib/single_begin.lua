-- The start of a single-policy script (a block: KEYS and ARGV as ratelimit.lua's with one
-- policy): declares the algorithm block's inputs (key, now, limit, param, cost, extra, consume)
-- and outputs (allowed, remaining, reset, retry). One policy: consuming only when allowed is
-- already all-or-nothing, so the block consumes on a hit, and on a soft hit when the policy
-- does not gate. Numbers are read with `+ 0` (Lua's own coercion), cheaper than a call to the
-- global tonumber on this path.
local now = ARGV[2]
--#include lib/clock.lua
local key, extra = KEYS[1], ARGV[7]
local limit, param, cost = ARGV[4] + 0, ARGV[5] + 0, ARGV[6] + 0
local consume = ARGV[1] == 'hit' or (ARGV[1] == 'soft' and ARGV[8] == '0')
local allowed, remaining, reset, retry
