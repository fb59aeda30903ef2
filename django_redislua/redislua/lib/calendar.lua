-- calendar ("ca"): at most LIMIT per calendar period (an hour, day, week or month of a
-- timezone), the count reset at the period's boundary on this server's clock.
-- Params: limit = requests per period; param = the longest the period can be (us, unused
-- here); cost = units to take; extra = "B1,B2,B0,B3", boundaries in whole seconds since the
-- epoch that the app computed around its own clock (limiting/calendar.py): B1 and B2 start and
-- end the period holding the app's clock, B0 starts the one before and B3 ends the one after.
-- The one holding NOW is decided, so a server clock up to a period away from the app's still
-- decides in its own period; a NOW outside all three is an error (clocks a period apart). The
-- common case reads B1 and B2 only, at fixed places (ten digits each, 2001-2286).
-- extra = "" (a peek only: the admin, which does not know an identity's timezone) reads the
-- stored period, whatever it is, its end being the key's expiry.
-- Key: the period's start in whole seconds and the count, as the decimal digits of both, 10 + 9
-- (a 19-digit integer below 2^63, which Redis stores in its object's pointer: no allocation of
-- its own, the size of a fixed window's) while the start has 10 digits (2001-2262); else
-- "START:COUNT". The count is below 10^9 (redislua.E006 caps the limit). Expires when the period
-- ends, set by the write that opens it; a hit in the same period adds its cost in place
-- (INCRBY), keeping that expiry. A stored period later than NOW's (a clock that went back, a
-- failover to a replica behind; or an identity's timezone changed) stays the one counted,
-- until its key expires: a clock going back never opens a fresh period.
-- An algorithm block (see ratelimit.lua).
do
  local start, finish, stored, count, digits = nil, nil, nil, 0, false
  local state = redis.call('GET', key)
  if state then
    if #state == 19 then
      stored, count, digits = string.sub(state, 1, 10) * 1000000, string.sub(state, 11) + 0, true
    else
      local s, c = string.match(state, '^(%d+):(%d+)$')
      stored, count = s * 1000000, c + 0
    end
  end
  if extra == '' then
    if stored then start, finish = stored, now + math.max(redis.call('PTTL', key), 1) * 1000 end
  else
    local fixed, b1, b2, b0, b3 = #extra == 43, nil, nil, nil, nil
    if fixed then
      b1, b2 = string.sub(extra, 1, 10) * 1000000, string.sub(extra, 12, 21) * 1000000
    else
      b1, b2, b0, b3 = string.match(extra, '^(%d+),(%d+),(%d+),(%d+)$')
      b1, b2 = b1 * 1000000, b2 * 1000000
    end
    if now >= b1 and now < b2 then
      start, finish = b1, b2
    else
      if fixed then b0, b3 = string.sub(extra, 23, 32), string.sub(extra, 34, 43) end
      b0, b3 = b0 * 1000000, b3 * 1000000
      if now >= b0 and now < b1 then start, finish = b0, b1
      elseif now >= b2 and now < b3 then start, finish = b2, b3
      else
        error(redis.error_reply(string.format(
          'ERR redislua: the server clock (%.0f us) is more than a calendar period away from '
          .. "the app's (%.0f..%.0f)", now, b0, b3)))
      end
    end
    if stored and stored > start then
      start, finish = stored, now + math.max(redis.call('PTTL', key), 1) * 1000
    elseif stored ~= start then
      stored, count, digits = nil, 0, false  -- an earlier period's count: this one is fresh
    end
  end
  if not start then start, finish = now, now end  -- a peek of no state without bounds
  local left = finish - now
  allowed, retry = count + cost <= limit, 0
  if not allowed then
    retry = left
  elseif consume then
    count = count + cost
    if digits then
      redis.call('INCRBY', key, cost)  -- in place: the period's expiry stays
    else
      local seconds = start / 1000000
      local packed
      if seconds >= 1000000000 and seconds < 9223372036 then
        packed = string.format('%d%09d', seconds, count)
      else
        packed = string.format('%d:%d', seconds, count)
      end
      redis.call('SET', key, packed, 'PX', math.max(math.ceil(left / 1000), 1))
    end
  end
  remaining, reset = limit - count, count > 0 and left or 0
end
