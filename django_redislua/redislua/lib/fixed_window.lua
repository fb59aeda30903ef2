-- fixed_window ("fw"): at most LIMIT per window of PERIOD, the window starting at the first hit.
-- Key: the window start (us) and the count, in the smallest form they fit: the decimal digits
-- of both, 16 + 3 (a 19-digit integer, which Redis stores in its object's pointer: no
-- allocation of its own) while the count is below 1000 and the start has 16 digits below
-- 9.2 * 10^15 (2001-2262); else struct '<I7I5' (12 bytes, kept in the object's own 32-byte
-- allocation) while the start is below 2^53 and the count below 2^40; else '<dd' (16 bytes, the
-- previous release's only form). Every form is read; the length tells them apart; a value none
-- of them holds (outside the times and counts written) reads as no state. Expires when
-- the window ends, set by the write that opens the window (or changes the form). A hit in the
-- same window of the decimal form adds its cost to the count's digits in place (`INCRBY`: nothing
-- formatted), keeping that expiry: the window end a `SET PX` would derive again (to the ms), NOW
-- and the expiry being the same server's clock, as long as the period is the one the window
-- opened with. So a window decided with a rate a live override changed (not OWN_RATE) is never
-- in the decimal form and never added to in place: the first hit under and after an override
-- rewrites the state and its expiry. (A period lengthened in settings keeps the window in
-- progress's expiry: docs/ratelimit.md, "Changing a rate".)
-- Params: limit = requests per window, param = period (us), cost = units to take; extra unused.
-- An algorithm block (see ratelimit.lua).
do
  local period, start, count, digits = param, nil, 0, false
  local state = redis.call('GET', key)
  if state then
    local size = #state
    if size == 19 then
      start, count, digits = string.sub(state, 1, 16) + 0, string.sub(state, 17) + 0, true
    elseif size == 12 then start, count = struct.unpack('<I7I5', state)
    elseif size == 16 then start, count = struct.unpack('<dd', state) end
    -- A value no form of ours holds (another writer's: text, a number) reads as no state,
    -- replaced by the next admitted hit: never a window that cannot end (a start beyond 2^53 us,
    -- not a number), which would deny the identity for centuries. (Times are below 2^53 us,
    -- the year 2255, where Lua's doubles stop being exact. Nineteen characters that are not
    -- digits fail the script: docs/ratelimit.md.)
    if start and not (start > -9007199254740992 and start < 9007199254740992 and count >= 0
                      and count < 9007199254740992) then
      start, count, digits = nil, 0, false
    end
  end
  -- A clock that went back (now < start: a failover to a replica behind) stays in the stored
  -- window, which then lasts longer: it must never open a fresh one.
  if not start or now >= start + period then
    start, count, digits = now, 0, false
  end
  local left = start + period - now  -- > 0
  allowed, retry = count + cost <= limit, 0
  if not allowed then
    retry = left
  elseif consume then
    count = count + cost
    if digits and own_rate and count < 1000 then
      redis.call('INCRBY', key, cost)  -- in place: the window's expiry stays
    else
      local packed
      if start % 1 ~= 0 then
        packed = struct.pack('<dd', start, count)
      elseif own_rate and count < 1000 and start >= 1e15 and start < 9.2e15 then
        packed = string.format('%d%03d', start, count)
      elseif start >= 0 and start < 9007199254740992 and count < 1099511627776 then
        packed = struct.pack('<I7I5', start, count)
      else
        packed = struct.pack('<dd', start, count)
      end
      -- (LEFT >= 1 us, so its ceiling in ms is at least 1)
      redis.call('SET', key, packed, 'PX', math.ceil(left / 1000))
    end
  end
  remaining, reset = limit - count, count > 0 and left or 0
end
