-- fixed_window ("fw"): at most LIMIT per window of PERIOD, the window starting at the first hit.
-- Key: the window start (us) and the count, in the smallest form they fit: the decimal digits
-- of both, 16 + 3 (a 19-digit integer, which Redis stores in its object's pointer: no
-- allocation of its own) while the count is below 1000 and the start has 16 digits below
-- 9.2 * 10^15 (2001-2262); else struct '<I7I5' (12 bytes, kept in the object's own 32-byte
-- allocation) while the start is below 2^53 and the count below 2^40; else '<dd' (16 bytes, the
-- previous release's only form). Every form is read; the length tells them apart. Expires when
-- the window ends.
-- Params: limit = requests per window, param = period (us), cost = units to take; extra unused.
-- An algorithm block (see ratelimit.lua).
do
  local period, start, count = param, nil, 0
  local state = redis.call('GET', key)
  if state then
    local size = #state
    if size == 19 then start, count = string.sub(state, 1, 16) + 0, string.sub(state, 17) + 0
    elseif size == 12 then start, count = struct.unpack('<I7I5', state)
    elseif size == 16 then start, count = struct.unpack('<dd', state) end
  end
  -- A clock that went back (now < start: a failover to a replica behind) stays in the stored
  -- window, which then lasts longer: it must never open a fresh one.
  if not start or now >= start + period then
    start, count = now, 0
  end
  local left = start + period - now  -- > 0
  allowed, retry = count + cost <= limit, 0
  if not allowed then
    retry = left
  elseif consume then
    count = count + cost
    local packed
    if start % 1 ~= 0 then
      packed = struct.pack('<dd', start, count)
    elseif count < 1000 and start >= 1e15 and start < 9.2e15 then
      packed = string.format('%d%03d', start, count)
    elseif start >= 0 and start < 9007199254740992 and count < 1099511627776 then
      packed = struct.pack('<I7I5', start, count)
    else
      packed = struct.pack('<dd', start, count)
    end
    -- (LEFT >= 1 us, so its ceiling in ms is at least 1)
    redis.call('SET', key, packed, 'PX', math.ceil(left / 1000))
  end
  remaining, reset = limit - count, count > 0 and left or 0
end
