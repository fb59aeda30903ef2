-- sliding_window ("sw"): the weighted two-window counter; O(1) memory, approximate.
-- Windows are aligned to multiples of PERIOD. The estimate of hits in the last PERIOD is
-- previous * (PERIOD - elapsed) / PERIOD + current; a hit is allowed while estimate + cost <= limit.
-- All comparisons are done multiplied through by PERIOD, in exact integers.
-- Key: the current window's start, current count, previous count, packed: struct '<I6I3I3'
-- with the start in ms (12 bytes, kept in the key's own allocation) while the period is a whole
-- number of ms (any rate in s, m, h or d) and both counts are below 2^24, else '<ddd' with the
-- start in us (24 bytes, the previous release's only form, still read); expires when the next
-- window ends (until then the current count still weighs on the estimate).
-- Params: limit = hits per period, param = period (us), cost = units to take; extra unused.
-- An algorithm block (see ratelimit.lua).
do
  local period = param
  local window = now - now % period  -- (exact: see ratelimit.lua on division)
  local stored, cur, prev
  local state = redis.call('GET', key)
  if state then
    if #state == 12 then
      stored, cur, prev = struct.unpack('<I6I3I3', state)
      stored = stored * 1000
    elseif #state == 24 then
      stored, cur, prev = struct.unpack('<ddd', state)
    end
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
  local elapsed = now - window
  if elapsed < 0 then elapsed = 0 end
  local weighted = prev * (period - elapsed)  -- previous window's share, times PERIOD
  allowed, retry = weighted + (cur + cost) * period <= limit * period, 0
  if not allowed then
    local room = (limit - cur - cost) * period
    if room >= 0 then
      -- this window: wait until the previous window's share has shrunk enough
      retry = period - math.floor(room / prev) - elapsed
    else
      -- next window, where this window's count becomes the weighted previous one
      local wait_in_next = 0
      if cur > 0 then wait_in_next = math.max(0, period - math.floor((limit - cost) * period / cur)) end
      retry = period - elapsed + wait_in_next
    end
  elseif consume then
    cur = cur + cost
    -- (2 * period - elapsed > period: the TTL in ms rounded up is at least 1)
    local packed
    if period % 1000 == 0 and window >= 0 and cur < 16777216 and prev < 16777216 then
      packed = struct.pack('<I6I3I3', window / 1000, cur, prev)
    else
      packed = struct.pack('<ddd', window, cur, prev)
    end
    redis.call('SET', key, packed, 'PX', math.ceil((2 * period - elapsed) / 1000))
  end
  local left = limit * period - weighted - cur * period
  remaining = left > 0 and math.floor(left / period) or 0
  reset = 0
  if cur > 0 then reset = 2 * period - elapsed elseif prev > 0 then reset = period - elapsed end
end
