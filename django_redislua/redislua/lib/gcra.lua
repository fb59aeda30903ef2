-- gcra ("gc"): the generic cell rate algorithm; one value per key, the theoretical arrival time
-- (TAT). The emission interval is P / Q microseconds exactly (the rate's period over its count,
-- reduced), so a rate of 10^7/s is P = 1, Q = 10, with no rounding to whole microseconds.
-- A request of COST is admitted if TAT + cost * interval - now <= burst * interval.
-- Key: struct '<Bdd': tag 5, a, b, the TAT being a + b / Q microseconds (0 <= b < Q); expires
-- when the TAT passes (the state is full again). Arithmetic is done in units of 1/Q us, in integers.
-- Params: limit = burst (requests admitted back to back from rest), param = P, cost, extra = Q.
ALGORITHMS['gc'] = function(key, now, burst, p, cost, extra, consume)
  local q = tonumber(extra)
  local a, b = now, 0
  local state = redis.call('GET', key)
  if state and #state == 17 then
    local tag, sa, sb = struct.unpack('<Bdd', state)
    if tag == 5 then a, b = sa, sb end
  end
  if a < now then a, b = now, 0 end  -- a TAT in the past: the bucket is full
  local lead = (a - now) * q + b      -- TAT - now, in 1/Q us
  local step = cost * p
  local tolerance = burst * p
  if lead + step > tolerance then
    return false, idiv(tolerance - lead, p), cdiv(lead, q), cdiv(lead + step - tolerance, q)
  end
  if consume then
    local nb = b + step
    a, b = a + idiv(nb, q), nb - idiv(nb, q) * q
    lead = lead + step
    redis.call('SET', key, struct.pack('<Bdd', 5, a, b), 'PX', ttl_ms(cdiv(lead, q)))
  end
  return true, idiv(tolerance - lead, p), cdiv(lead, q), 0
end
