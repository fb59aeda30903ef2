-- The one clamping rule of a decision's reply (a block: the including script has the locals
-- remaining, reset and retry), for the single-policy scripts and ratelimit.lua alike: a
-- remaining quota below 0 (a limit lowered below what was already used) is shown as 0. The
-- algorithm blocks never set a negative reset or retry; tests/test_engine_properties.py checks
-- every field of both scripts against the models, and against each other on random inputs.
if remaining < 0 then remaining = 0 end
