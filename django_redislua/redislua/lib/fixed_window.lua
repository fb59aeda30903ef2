-- fixed_window ("fw"): at most LIMIT per window of PERIOD, the window starting at the first hit.
-- Key: struct '<dd': window start (us), count; expires when the window ends.
-- Params: limit = requests per window, param = period (us), cost = units to take; extra unused.
-- An algorithm block (see ratelimit.lua).
do
  local period, start, count = param, nil, 0
  local state = redis.call('GET', key)
  if state and #state == 16 then start, count = struct.unpack('<dd', state) end
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
    -- (LEFT >= 1 us, so its ceiling in ms is at least 1)
    redis.call('SET', key, struct.pack('<dd', start, count), 'PX', math.ceil(left / 1000))
  end
  remaining, reset = limit - count, count > 0 and left or 0
end
