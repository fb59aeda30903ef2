-- sliding_window ("sw"): the weighted two-window counter; O(1) memory, approximate.
-- Windows are aligned to multiples of PERIOD. The estimate of hits in the last PERIOD is
-- previous * (PERIOD - elapsed) / PERIOD + current; a hit is allowed while estimate + cost <= limit.
-- All comparisons are done multiplied through by PERIOD, in exact integers.
-- Key: the current window's start, current count, previous count, in the smallest form they
-- fit: the decimal digits of the start in ms and of both counts, 13 + 3 + 3 (a 19-digit
-- integer, which Redis stores in its object's pointer: no allocation of its own) while the
-- period is a whole number of ms, both counts are below 1000 and the start has 13 digits below
-- 9.2 * 10^12 (2001-2262); else struct '<I6I3I3', the start in ms (12 bytes, kept in the
-- object's own 32-byte allocation) while both counts are below 2^24; else '<ddd', the start in
-- us (24 bytes, the previous release's only form). Every form is read; the length tells them
-- apart; a value none of them holds (outside the times and counts written) reads as no state.
-- Expires when the next window ends (until then the current count still weighs on the
-- estimate), set by the write that opens a window (or changes the form). A hit in the same
-- window of the decimal form adds its cost to the current count's digits in place (`INCRBY`:
-- nothing formatted), keeping that expiry, as the fixed window does and on the same terms: not
-- in a window the clock went back into (whose rewrite derives a shorter expiry), and never with
-- a rate a live override changed (not OWN_RATE: that state is not kept in the decimal form).
-- Params: limit = hits per period, param = period (us), cost = units to take; extra unused.
-- An algorithm block (see ratelimit.lua).
do
  local period = param
  local window = now - now % period  -- (exact: see ratelimit.lua on division)
  local stored, cur, prev, digits
  local state = redis.call('GET', key)
  if state then
    local size = #state
    if size == 19 then
      stored, digits = string.sub(state, 1, 13) * 1000, true
      cur, prev = string.sub(state, 14, 16) + 0, string.sub(state, 17) + 0
    elseif size == 12 then
      stored, cur, prev = struct.unpack('<I6I3I3', state)
      stored = stored * 1000
    elseif size == 24 then
      stored, cur, prev = struct.unpack('<ddd', state)
    end
    -- Not a state we write (another writer's value): no state, never a window from beyond
    -- 2^53 us that the clock could never leave.
    if stored and not (stored > -9007199254740992 and stored < 9007199254740992
                       and cur >= 0 and cur < 9007199254740992
                       and prev >= 0 and prev < 9007199254740992) then
      stored, digits = nil, false
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
    if digits and own_rate and stored == window and now >= window and cur < 1000 then
      redis.call('INCRBY', key, cost * 1000)  -- in place: the window's expiry stays
    else
      -- (2 * period - elapsed > period: the TTL in ms rounded up is at least 1)
      local packed
      if period % 1000 ~= 0 or window < 0 then
        packed = struct.pack('<ddd', window, cur, prev)
      elseif own_rate and cur < 1000 and prev < 1000 and window >= 1e15 and window < 9.2e15 then
        packed = string.format('%d%03d%03d', window / 1000, cur, prev)
      elseif cur < 16777216 and prev < 16777216 then
        packed = struct.pack('<I6I3I3', window / 1000, cur, prev)
      else
        packed = struct.pack('<ddd', window, cur, prev)
      end
      redis.call('SET', key, packed, 'PX', math.ceil((2 * period - elapsed) / 1000))
    end
  end
  local left = limit * period - weighted - cur * period
  remaining = left > 0 and math.floor(left / period) or 0
  reset = 0
  if cur > 0 then reset = 2 * period - elapsed elseif prev > 0 then reset = period - elapsed end
end
