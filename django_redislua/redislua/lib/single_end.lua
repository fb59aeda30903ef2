-- The end of a single-policy script (a block, after the algorithm's): the four-integer reply,
-- negative figures (a limit lowered below what was used) shown as 0.
if remaining < 0 then remaining = 0 end
if reset < 0 then reset = 0 end
if retry < 0 then retry = 0 end
return {allowed and 1 or 0, remaining, reset, retry}
