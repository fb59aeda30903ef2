-- fixed_window ("fw"): at most LIMIT per window of PERIOD, the window starting at the first hit.
-- Key: the window start (us) and the count, packed: struct '<I7I5' (12 bytes: a value Redis
-- keeps in the key's own 32-byte allocation) while the start is below 2^53 and the count below
-- 2^40, else '<dd' (16 bytes, the previous release's only form, still read); expires when the
-- window ends.
-- Params: limit = requests per window, param = period (us), cost = units to take; extra unused.
-- An algorithm block (see ratelimit.lua).
do
  local period, start, count = param, nil, 0
  local state = redis.call('GET', key)
  if state then
    if #state == 12 then start, count = struct.unpack('<I7I5', state)
    elseif #state == 16 then start, count = struct.unpack('<dd', state) end
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
    if start >= 0 and start < 9007199254740992 and count < 1099511627776 and start % 1 == 0 then
      packed = struct.pack('<I7I5', start, count)
    else
      packed = struct.pack('<dd', start, count)
    end
    -- (LEFT >= 1 us, so its ceiling in ms is at least 1)
    redis.call('SET', key, packed, 'PX', math.ceil(left / 1000))
  end
  remaining, reset = limit - count, count > 0 and left or 0
end
