-- fixed_window ("fw"): at most LIMIT per window of PERIOD, the window starting at the first hit.
-- Key: struct '<Bdd': tag 1, window start (us), count; expires when the window ends.
-- Params: limit = requests per window, param = period (us), cost = units to take; extra unused.
ALGORITHMS['fw'] = function(key, now, limit, period, cost, extra, consume)
  local start, count
  local state = redis.call('GET', key)
  if state and #state == 17 then
    local tag, s, n = struct.unpack('<Bdd', state)
    if tag == 1 then start, count = s, n end
  end
  -- A clock that went back (now < start: a failover to a replica behind) stays in the stored
  -- window, which then lasts longer: it must never open a fresh one.
  if not start or now >= start + period then
    start, count = now, 0
  end
  local left = start + period - now
  local allowed = count + cost <= limit
  if not allowed then
    return false, limit - count, count > 0 and left or 0, left
  end
  if consume then
    count = count + cost
    redis.call('SET', key, struct.pack('<Bdd', 1, start, count), 'PX', ttl_ms(left))
  end
  return true, limit - count, count > 0 and left or 0, 0
end
