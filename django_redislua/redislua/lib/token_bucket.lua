-- token_bucket ("tb"): a bucket of LIMIT tokens (the burst) refilled one token per interval of
-- P / Q microseconds exactly (the rate's period over its count, reduced: no rounding).
-- Tokens arrive whole; a full bucket stops the refill clock. Denied requests take nothing.
-- Key: a string "<tokens>:<a>:<b>", the last refill at a + b / Q us (0 <= b < Q); expires when
-- the bucket is full again. Times are compared in units of 1/Q us, in integers.
-- Params: limit = capacity (burst), param = P, cost = tokens to take, extra = Q.
ALGORITHMS['tb'] = function(key, now, capacity, p, cost, extra, consume)
  local q = tonumber(extra)
  local tokens, a, b
  local state = redis.call('GET', key)
  if state then
    local t, sa, sb = string.match(state, '^(%d+):(%d+):?(%d*)$')
    tokens, a, b = tonumber(t), tonumber(sa), tonumber(sb) or 0
  end
  if not tokens or not a then
    tokens, a, b = capacity, now, 0
  else
    local elapsed = (now - a) * q - b  -- since the last refill, in 1/Q us
    if elapsed > 0 then  -- (a clock that went back refills nothing)
      local refill = idiv(elapsed, p)
      if tokens + refill >= capacity then
        tokens, a, b = capacity, now, 0
      else
        local nb = b + refill * p
        tokens, a, b = tokens + refill, a + idiv(nb, q), nb - idiv(nb, q) * q
      end
    end
  end
  if tokens > capacity then tokens, a, b = capacity, now, 0 end  -- capacity lowered in settings
  -- microseconds from now until K more tokens have arrived (rounded up: never too early)
  local function until_tokens(k)
    local scaled = (a - now) * q + b + k * p
    if scaled <= 0 then return 0 end
    return cdiv(scaled, q)
  end
  if tokens < cost then  -- so tokens < capacity: the bucket is refilling
    return false, tokens, until_tokens(capacity - tokens), until_tokens(cost - tokens)
  end
  if consume then tokens = tokens - cost end
  local full_in = 0
  if tokens < capacity then full_in = until_tokens(capacity - tokens) end
  if consume then
    redis.call('SET', key, tokens .. ':' .. int(a) .. ':' .. int(b), 'PX', ttl_ms(full_in))
  end
  return true, tokens, full_in, 0
end
