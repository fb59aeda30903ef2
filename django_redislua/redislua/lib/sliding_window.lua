-- sliding_window ("sw"): the weighted two-window counter; O(1) memory, approximate.
-- Windows are aligned to multiples of PERIOD. The estimate of hits in the last PERIOD is
-- previous * (PERIOD - elapsed) / PERIOD + current; a hit is allowed while estimate + cost <= limit.
-- All comparisons are done multiplied through by PERIOD, in exact integers.
-- Key: struct '<Bddd': tag 2, current window start (us), current count, previous count;
-- expires when the next window ends (until then the current count still weighs on the estimate).
-- Params: limit = hits per period, param = period (us), cost = units to take; extra unused.
ALGORITHMS['sw'] = function(key, now, limit, period, cost, extra, consume)
  local window = now - math.fmod(now, period)
  local stored, cur, prev
  local state = redis.call('GET', key)
  if state and #state == 25 then
    local tag, w, c, p = struct.unpack('<Bddd', state)
    if tag == 2 then stored, cur, prev = w, c, p end
  end
  if stored and stored > window then
    -- The clock went back into an older window: stay in the newest one seen, never a fresh one.
    window = stored
  end
  if stored == window then
    -- same window: counts as stored
  elseif stored == window - period then
    prev, cur = cur, 0
  else
    prev, cur = 0, 0
  end
  local elapsed = math.max(0, now - window)
  local weighted = prev * (period - elapsed)  -- previous window's share, times PERIOD
  local allowed = weighted + (cur + cost) * period <= limit * period
  local retry = 0
  if not allowed then
    local room = (limit - cur - cost) * period
    if room >= 0 then
      -- this window: wait until the previous window's share has shrunk enough
      retry = period - idiv(room, prev) - elapsed
    else
      -- next window, where this window's count becomes the weighted previous one
      local wait_in_next = 0
      if cur > 0 then wait_in_next = math.max(0, period - idiv((limit - cost) * period, cur)) end
      retry = period - elapsed + wait_in_next
    end
  elseif consume then
    cur = cur + cost
    redis.call('SET', key, struct.pack('<Bddd', 2, window, cur, prev), 'PX',
               ttl_ms(2 * period - elapsed))
  end
  local remaining = idiv(math.max(0, limit * period - weighted - cur * period), period)
  local reset = 0
  if cur > 0 then reset = 2 * period - elapsed elseif prev > 0 then reset = period - elapsed end
  return allowed, remaining, reset, retry
end
