-- The end of a single-policy script (a block, after the algorithm's): the four-integer reply.
-- A remaining quota below 0 (a limit lowered below what was used) is shown as 0; the blocks
-- never set a negative reset or retry.
if remaining < 0 then remaining = 0 end
return {allowed and 1 or 0, remaining, reset, retry}
