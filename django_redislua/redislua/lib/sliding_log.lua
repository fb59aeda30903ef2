-- sliding_log ("sl"): exact; at most LIMIT hits in any span of PERIOD. Stores one entry per unit
-- of cost admitted.
-- Key: a string of entries, each a hit's time (us) as struct '<I7' (7 bytes), in time order (a
-- hit timed before the newest entry, after the server clock went back, goes in its place);
-- expires PERIOD after the newest hit. Times are whole microseconds, 0 <= t < 2^53 (TIME, or
-- what a test injects). The previous release kept a sorted set here: read as no state (at most
-- one window of extra quota after an upgrade), and replaced by the next hit.
-- Params: limit = hits per period, param = period (us), cost = entries to add (<= limit); extra
-- unused.
-- An algorithm block (see ratelimit.lua). The searches halve a range of at most 2^53 entries:
-- bounded loops.
do
  local period = param
  local horizon = now - period
  local log = redis.pcall('GET', key)  -- false: no key; an error reply: the old sorted set
  if type(log) ~= 'string' then log = '' end
  local n = #log / 7
  -- The first live entry (time > horizon); every entry before it has aged out.
  local lo, hi = 1, n + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if struct.unpack('<I7', log, 7 * mid - 6) > horizon then hi = mid else lo = mid + 1 end
  end
  local first = lo
  local count = n - first + 1
  allowed, reset, retry = count + cost <= limit, 0, 0
  remaining = limit - count
  if allowed and consume then
    -- The new entries go after every entry timed at or before NOW: at the end, unless the
    -- clock went back.
    local at = n + 1
    if count > 0 and struct.unpack('<I7', log, 7 * n - 6) > now then
      lo, hi = first, n + 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if struct.unpack('<I7', log, 7 * mid - 6) > now then hi = mid else lo = mid + 1 end
      end
      at = lo
    end
    local added = string.rep(struct.pack('<I7', now), cost)
    log = string.sub(log, 7 * first - 6, 7 * at - 7) .. added .. string.sub(log, 7 * at - 6)
    redis.call('SET', key, log, 'PX', math.ceil(period / 1000))
    remaining, reset = remaining - cost, period
  else
    if count > 0 then
      reset = struct.unpack('<I7', log, 7 * n - 6) + period - now  -- the newest entry
    end
    if not allowed then
      -- Wait until enough of the oldest live entries have aged out.
      retry = struct.unpack('<I7', log, 7 * (first + count + cost - limit - 1) - 6) + period - now
    end
  end
end
