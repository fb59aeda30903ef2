-- sliding_window ("sw"): the weighted two-window counter; O(1) memory, approximate.
-- Windows are aligned to multiples of PERIOD. The estimate of hits in the last PERIOD is
-- previous * (PERIOD - elapsed) / PERIOD + current; a hit is allowed while estimate + cost <= limit.
-- All comparisons are done multiplied through by PERIOD, in exact integers.
-- Key: a hash {w = current window start (us), c = current count, p = previous count}.
-- Params: limit = hits per period, param = period (us), cost = units to take; extra unused.
ALGORITHMS['sw'] = function(key, now, limit, period, cost, extra)
  local window = now - math.fmod(now, period)
  local state = redis.call('HMGET', key, 'w', 'c', 'p')
  local stored, cur, prev = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
  if stored == window then
    -- same window: counts as stored
  elseif stored == window - period then
    prev, cur = cur, 0
  else
    prev, cur = 0, 0
  end
  local elapsed = now - window
  local weighted = prev * (period - elapsed)  -- previous window's share, times PERIOD
  local allowed = weighted + (cur + cost) * period <= limit * period
  return {
    allowed = allowed,
    commit = function()
      redis.call('HSET', key, 'w', int(window), 'c', cur + cost, 'p', prev)
      expire_us(key, 2 * period - elapsed)
    end,
    report = function(committed)
      local c = cur
      if committed then c = c + cost end
      local remaining = math.max(0, idiv(math.max(0, limit * period - weighted - c * period), period))
      local reset, retry = 0, 0
      if c > 0 then reset = 2 * period - elapsed elseif prev > 0 then reset = period - elapsed end
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
      end
      return remaining, reset, retry
    end,
  }
end
