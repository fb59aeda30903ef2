-- fixed_window ("fw"): at most LIMIT per window of PERIOD, the window starting at the first hit.
-- Key: a hash {s = window start (us), n = count}; expires when the window ends.
-- Params: limit = requests per window, param = period (us), cost = units to take; extra unused.
ALGORITHMS['fw'] = function(key, now, limit, period, cost, extra)
  local state = redis.call('HMGET', key, 's', 'n')
  local start, count = tonumber(state[1]), tonumber(state[2]) or 0
  if not start or now >= start + period or now < start then
    start, count = now, 0
  end
  local allowed = count + cost <= limit
  return {
    allowed = allowed,
    commit = function()
      redis.call('HSET', key, 's', int(start), 'n', count + cost)
      expire_us(key, start + period - now)
    end,
    report = function(committed)
      local used = count
      if committed then used = used + cost end
      local reset, retry = 0, 0
      if used > 0 then reset = start + period - now end
      if not allowed then retry = start + period - now end
      return limit - used, reset, retry
    end,
  }
end
