-- leaky_bucket ("lb"): the meter form. Each request pours one interval (P / Q us exactly) of
-- water into a bucket of LIMIT intervals that drains continuously, one microsecond of water per
-- microsecond. A request is admitted while its water fits. Denied requests pour nothing.
-- Water is counted in units of 1/Q us, in integers.
-- Key: struct '<Bdd': tag 4, the water level (1/Q us), the time it was measured (us); expires
-- when empty.
-- Params: limit = capacity in requests (burst), param = P, cost, extra = Q.
ALGORITHMS['lb'] = function(key, now, capacity, p, cost, extra, consume)
  local q = tonumber(extra)
  local level, at = 0, now
  local state = redis.call('GET', key)
  if state and #state == 17 then
    local tag, l, t = struct.unpack('<Bdd', state)
    if tag == 4 then level, at = l, t end
  end
  if now > at then
    level, at = math.max(0, level - (now - at) * q), now
  end
  -- A clock that went back (now < at) drains nothing, and the level stays measured at AT, so the
  -- time between now and at is never drained twice.
  local lag = at - now  -- 0 unless the clock went back: the draining resumes only at AT
  local size = capacity * p
  local poured = level + cost * p
  if poured > size then
    return false, idiv(size - level, p), cdiv(level, q) + lag, cdiv(poured - size, q) + lag
  end
  if consume then
    redis.call('SET', key, struct.pack('<Bdd', 4, poured, at), 'PX',
               ttl_ms(cdiv(poured, q) + lag))
    level = poured
  end
  return true, idiv(size - level, p), cdiv(level, q) + lag, 0
end
