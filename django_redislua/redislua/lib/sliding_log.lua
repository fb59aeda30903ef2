-- sliding_log ("sl"): exact; at most LIMIT hits in any span of PERIOD. Stores one entry per unit
-- of cost admitted.
-- Key, in the form its limit calls for: up to 128 (a small log), a string of 7-byte entries,
-- each a hit's time (us) as struct '<I7', in time order (a hit timed before the newest entry,
-- after the server clock went back, goes in its place), which costs 7 bytes an entry but is
-- rewritten by each admitted hit; above 128, a sorted set, one member "<time>:<n>" (unique among
-- the live entries) per entry scored by its time, O(log n) a hit. Every script reads both
-- forms (the previous release's sorted set too, whatever its limit); an admitted hit writes
-- the form its limit calls for, moving the live entries over (at most the limit) when the key
-- holds the other. Either expires PERIOD after the newest hit. Times are whole microseconds,
-- 0 <= t < 2^53 (TIME, or what a test injects).
-- Params: limit = hits per period, param = period (us), cost = entries to add (<= limit); extra
-- unused.
-- An algorithm block (see ratelimit.lua). Bounded: the searches halve the log, the moves and
-- additions are at most LIMIT entries, added to a sorted set in chunks (unpack() of more than a
-- few thousand values exceeds Lua's C stack).
do
  local period = param
  local horizon = now - period
  local after = string.format('(%d', horizon)
  -- One call finds the form the limit calls for; an error reply (WRONGTYPE) says the key holds
  -- the other, then read.
  local small = limit <= 128  -- the form this limit calls for
  local log, sorted, count, first, n, foreign = false, false, 0, 1, 0, false
  if not small then
    count = redis.pcall('ZCOUNT', key, after, '+inf')  -- 0 for no key
    sorted = type(count) == 'number'
    if not sorted then log = redis.call('GET', key) end
  else
    log = redis.pcall('GET', key)  -- false for no key
    sorted = type(log) == 'table'
    if sorted then count = redis.call('ZCOUNT', key, after, '+inf') end
  end
  if not sorted then
    -- Not a log we write (another writer's value: not whole 7-byte entries, or its newest entry,
    -- the largest, beyond 2^53 us): an empty log, replaced by the next admitted hit. Never
    -- entries timed centuries ahead, which would deny the identity until the key is deleted.
    if not log then
      log = ''
    elseif #log % 7 ~= 0 or (#log > 0 and struct.unpack('<I7', log, #log - 6) >= 9007199254740992)
    then
      log, foreign = '', true
    end
    n = #log / 7
    -- The first live entry (time > horizon): every entry before it has aged out.
    local lo, hi = 1, n + 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if struct.unpack('<I7', log, 7 * mid - 6) > horizon then hi = mid else lo = mid + 1 end
    end
    first = lo
    count = n - first + 1
  end
  allowed, reset, retry = count + cost <= limit, 0, 0
  remaining = limit - count
  if allowed and consume then
    if small then
      if sorted then  -- move the live entries (COUNT <= LIMIT - COST) into a small log
        local live = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES')
        local parts = {}
        for i = 2, #live, 2 do parts[i / 2] = struct.pack('<I7', live[i] + 0) end
        log, first, n = table.concat(parts), 1, count
      end
      -- The new entries go after every entry timed at or before NOW: at the end, unless the
      -- clock went back.
      local at = n + 1
      if count > 0 and struct.unpack('<I7', log, 7 * n - 6) > now then
        local lo, hi = first, n + 1
        while lo < hi do
          local mid = math.floor((lo + hi) / 2)
          if struct.unpack('<I7', log, 7 * mid - 6) > now then hi = mid else lo = mid + 1 end
        end
        at = lo
      end
      local added = string.rep(struct.pack('<I7', now), cost)
      log = string.sub(log, 7 * first - 6, 7 * at - 7) .. added .. string.sub(log, 7 * at - 6)
      redis.call('SET', key, log, 'PX', math.ceil(period / 1000))
    else
      local entries, moved = {}, 0
      if sorted then
        redis.call('ZREMRANGEBYSCORE', key, '-inf', horizon)
      else  -- move the live entries of a small log (COUNT <= 128) into a sorted set
        for i = first, n do
          local t = struct.unpack('<I7', log, 7 * i - 6)
          moved = moved + 1
          entries[2 * moved - 1], entries[2 * moved] = t, string.format('%d:%d', t, moved)
        end
        if n > 0 or foreign then redis.call('DEL', key) end
      end
      -- The moved entries go with the first chunk of new ones (at most 128 + 1000 pairs).
      local added = 0
      while added < cost do
        local chunk = math.min(cost - added, 1000)
        for i = 1, chunk do
          entries[2 * (moved + i) - 1] = now
          entries[2 * (moved + i)] = string.format('%d:%d', now, count + added + i)
        end
        redis.call('ZADD', key, unpack(entries, 1, 2 * (moved + chunk)))
        added, moved, entries = added + chunk, 0, {}
      end
      redis.call('PEXPIRE', key, math.ceil(period / 1000))
    end
    remaining, reset = remaining - cost, period
  else
    if count > 0 then  -- until the newest entry is PERIOD old
      local newest
      if sorted then
        newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] + 0
      else
        newest = struct.unpack('<I7', log, 7 * n - 6)
      end
      reset = newest + period - now
    end
    if not allowed then
      -- Wait until enough of the oldest live entries have aged out.
      local skip = count + cost - limit - 1
      if sorted then
        local entry = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', skip, 1)
        retry = entry[2] + period - now
      else
        retry = struct.unpack('<I7', log, 7 * (first + skip) - 6) + period - now
      end
    end
  end
end
