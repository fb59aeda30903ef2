-- leaky_bucket ("lb"): the meter form. Each request pours INTERVAL of water into a bucket of
-- LIMIT * INTERVAL that drains continuously, one microsecond of water per microsecond.
-- A request is admitted while its water fits. Denied requests pour nothing.
-- Key: a hash {l = water level (us), ts = time the level was measured (us)}; expires when empty.
-- Params: limit = capacity in requests (burst), param = drain interval per request (us), cost.
ALGORITHMS['lb'] = function(key, now, capacity, interval, cost, extra)
  local state = redis.call('HMGET', key, 'l', 'ts')
  local level, at = tonumber(state[1]) or 0, tonumber(state[2]) or now
  if now > at then level = math.max(0, level - (now - at)) end
  local size = capacity * interval
  local allowed = level + cost * interval <= size
  return {
    allowed = allowed,
    commit = function()
      local new_level = level + cost * interval
      redis.call('HSET', key, 'l', int(new_level), 'ts', int(now))
      expire_us(key, new_level)
    end,
    report = function(committed)
      local l = level
      if committed then l = l + cost * interval end
      local retry = 0
      if not allowed then retry = l + cost * interval - size end
      return idiv(size - l, interval), l, retry
    end,
  }
end
