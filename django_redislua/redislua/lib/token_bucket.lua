-- token_bucket ("tb"): a bucket of LIMIT tokens (the burst) refilled one token per INTERVAL.
-- Tokens arrive whole; a full bucket stops the refill clock. Denied requests take nothing.
-- Key: a hash {t = tokens, ts = time of the last refill (us)}; expires when the bucket is full.
-- Params: limit = capacity (burst), param = interval between tokens (us), cost = tokens to take.
ALGORITHMS['tb'] = function(key, now, capacity, interval, cost, extra)
  local state = redis.call('HMGET', key, 't', 'ts')
  local tokens, last = tonumber(state[1]), tonumber(state[2])
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
  local allowed = tokens >= cost
  local function full_in(t)
    if t >= capacity then return 0 end
    return math.max(0, last + (capacity - t) * interval - now)
  end
  return {
    allowed = allowed,
    commit = function()
      local left = tokens - cost
      redis.call('HSET', key, 't', left, 'ts', int(last))
      expire_us(key, full_in(left))
    end,
    report = function(committed)
      local left = tokens
      if committed then left = tokens - cost end
      local retry = 0
      if not allowed then retry = math.max(0, last + (cost - tokens) * interval - now) end
      return left, full_in(left), retry
    end,
  }
end
