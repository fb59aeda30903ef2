-- gcra ("gc"): the generic cell rate algorithm; one value per key, the theoretical arrival time
-- (TAT). A request of COST is admitted if TAT + cost * INTERVAL - now <= LIMIT * INTERVAL.
-- Key: a string holding the TAT (us); expires when the TAT passes (the state is full again).
-- Params: limit = burst (requests admitted back to back from rest), param = interval (us), cost.
ALGORITHMS['gc'] = function(key, now, burst, interval, cost, extra, consume)
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  local new_tat = tat + cost * interval
  local tolerance = burst * interval
  if new_tat - now > tolerance then
    return false, idiv(tolerance - (tat - now), interval), tat - now, new_tat - tolerance - now
  end
  if consume then
    redis.call('SET', key, new_tat, 'PX', ttl_ms(new_tat - now))
    tat = new_tat
  end
  return true, idiv(tolerance - (tat - now), interval), tat - now, 0
end
