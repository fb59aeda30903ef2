-- The end of a single-policy script (a block, after the algorithm's): closes lib/
-- single_begin.lua's `else`, then the reply, clamped by the rule every decision's reply follows
-- (lib/clamp.lua): allowed (1/0, plus 2 when an override answered, 4 when it changed the
-- rate), remaining, reset_after, retry_after; a changed rate adds its limit and how long it
-- lasts (us). A policy at a rate its rate callable gave (KEYS[3]) keeps it beside its state when
-- the decision consumed (lib/keep_rate.lua); a live override's allow wrote nothing.
end
if KEYS[3] and allowed and consume and override ~= 'a' then
  local rate_key, rate_record = KEYS[3], ARGV[10]
--#include lib/keep_rate.lua
end
--#include lib/clamp.lua
if override == nil then return {allowed and 1 or 0, remaining, reset, retry} end
if override == 'r' then
  return {(allowed and 1 or 0) + 4, remaining, reset, retry, limit, override_until - now}
end
return {(allowed and 1 or 0) + 2, remaining, reset, retry}
