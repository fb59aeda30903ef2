-- leaky_bucket ("lb"): the meter form. Each request pours INTERVAL of water into a bucket of
-- LIMIT * INTERVAL that drains continuously, one microsecond of water per microsecond.
-- A request is admitted while its water fits. Denied requests pour nothing.
-- Key: a string "<water level us>:<time the level was measured us>"; expires when empty.
-- Params: limit = capacity in requests (burst), param = drain interval per request (us), cost.
ALGORITHMS['lb'] = function(key, now, capacity, interval, cost, extra, consume)
  local level, at = 0, now
  local state = redis.call('GET', key)
  if state then
    local l, t = string.match(state, '^(%d+):(%d+)$')
    level, at = tonumber(l) or 0, tonumber(t) or now
  end
  if now > at then
    level, at = math.max(0, level - (now - at)), now
  end
  -- A clock that went back (now < at) drains nothing, and the level stays measured at AT, so the
  -- time between now and at is never drained twice.
  local lag = at - now  -- 0 unless the clock went back: the draining resumes only at AT
  local size = capacity * interval
  local poured = level + cost * interval
  if poured > size then
    return false, idiv(size - level, interval), level + lag, poured - size + lag
  end
  if consume then
    redis.call('SET', key, int(poured) .. ':' .. int(at), 'PX', ttl_ms(poured + lag))
    level = poured
  end
  return true, idiv(size - level, interval), level + lag, 0
end
