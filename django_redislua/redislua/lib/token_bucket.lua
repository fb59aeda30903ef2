-- token_bucket ("tb"): a bucket of LIMIT tokens (the burst) refilled one token per INTERVAL.
-- Tokens arrive whole; a full bucket stops the refill clock. Denied requests take nothing.
-- Key: a string "<tokens>:<time of the last refill us>"; expires when the bucket is full again.
-- Params: limit = capacity (burst), param = interval between tokens (us), cost = tokens to take.
ALGORITHMS['tb'] = function(key, now, capacity, interval, cost, extra, consume)
  local tokens, last
  local state = redis.call('GET', key)
  if state then
    local t, l = string.match(state, '^(%d+):(%d+)$')
    tokens, last = tonumber(t), tonumber(l)
  end
  if not tokens or not last then
    tokens, last = capacity, now
  elseif now > last then
    local refill = idiv(now - last, interval)
    if tokens + refill >= capacity then
      tokens, last = capacity, now
    else
      tokens, last = tokens + refill, last + refill * interval
    end
  end
  if tokens > capacity then tokens, last = capacity, now end  -- capacity lowered in settings
  if tokens < cost then  -- so tokens < capacity: the bucket is refilling
    return false, tokens, math.max(0, last + (capacity - tokens) * interval - now),
           math.max(0, last + (cost - tokens) * interval - now)
  end
  if consume then tokens = tokens - cost end
  local full_in = 0
  if tokens < capacity then full_in = math.max(0, last + (capacity - tokens) * interval - now) end
  if consume then
    redis.call('SET', key, tokens .. ':' .. int(last), 'PX', ttl_ms(full_in))
  end
  return true, tokens, full_in, 0
end
