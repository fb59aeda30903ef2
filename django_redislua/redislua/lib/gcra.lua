-- gcra ("gc"): the generic cell rate algorithm; one value per key, the theoretical arrival time
-- (TAT). A request of COST is admitted if TAT + cost * INTERVAL - now <= LIMIT * INTERVAL.
-- Key: a string holding the TAT (us); expires when the TAT passes (the state is full again).
-- Params: limit = burst (requests admitted back to back from rest), param = interval (us), cost.
ALGORITHMS['gc'] = function(key, now, burst, interval, cost, extra)
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  local new_tat = tat + cost * interval
  local tolerance = burst * interval
  local allowed = new_tat - now <= tolerance
  return {
    allowed = allowed,
    commit = function()
      redis.call('SET', key, int(new_tat), 'PX', math.max(1, cdiv(new_tat - now, 1000)))
    end,
    report = function(committed)
      local t = tat
      if committed then t = new_tat end
      local retry = 0
      if not allowed then retry = new_tat - tolerance - now end
      return idiv(tolerance - (t - now), interval), t - now, retry
    end,
  }
end
