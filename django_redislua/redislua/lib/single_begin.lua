-- The start of a single-policy script (a block: KEYS and ARGV as ratelimit.lua's with one
-- policy): declares the algorithm block's inputs (key, now, limit, param, cost, extra, consume,
-- own_rate)
-- and outputs (allowed, remaining, reset, retry). One policy: consuming only when allowed is
-- already all-or-nothing, so the block consumes on a hit, and on a soft hit when the policy
-- does not gate. Numbers are read with `+ 0` (Lua's own coercion), cheaper than a call to the
-- global tonumber on this path. A live override (lib/override.lua) answers instead of the
-- algorithm, or changes its rate: the block runs inside the `else` this opens, which
-- lib/single_end.lua closes. (The engine never sends a cost above the policy's own limit; a
-- changed rate's may be lower: that denial no wait can lift is retry -1.)
local now = ARGV[2]
--#include lib/clock.lua
local key, extra = KEYS[1], ARGV[7]
local limit, param, cost = ARGV[4] + 0, ARGV[5] + 0, ARGV[6] + 0
local consume = ARGV[1] == 'hit' or (ARGV[1] == 'soft' and ARGV[8] == '0')
local ovkey, name, code = KEYS[2], ARGV[9], ARGV[3]
--#include lib/override.lua
local own_rate = override == nil
local allowed, remaining, reset, retry
if override == 'b' then
  allowed, remaining, reset, retry = false, 0, override_until - now, override_until - now
elseif override == 'a' then
  allowed, remaining, reset, retry = true, limit, 0, 0
elseif cost > limit then  -- above a changed rate's capacity: no wait admits it (retry -1)
  allowed, remaining, reset, retry = false, limit, 0, -1
else
