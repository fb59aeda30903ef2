-- The end of a single-policy script (a block, after the algorithm's): the four-integer reply,
-- clamped by the rule every decision's reply follows (lib/clamp.lua).
--#include lib/clamp.lua
return {allowed and 1 or 0, remaining, reset, retry}
