-- token_bucket ("tb"): a bucket of LIMIT tokens (the burst) refilled one token per interval of
-- P / Q microseconds exactly (the rate's period over its count, reduced: no rounding).
-- Tokens arrive whole; a full bucket stops the refill clock. Denied requests take nothing.
-- Key: struct '<Bddd': tag 3, the tokens taken and not yet refilled (so rules of different
-- capacities sharing one state agree on what was used), and the last refill at a + b / Q us
-- (0 <= b < Q) as a, b; expires when the bucket is full again. Times are compared in units of 1/Q us.
-- Params: limit = capacity (burst), param = P, cost = tokens to take, extra = Q.
ALGORITHMS['tb'] = function(key, now, capacity, p, cost, extra, consume)
  local q = tonumber(extra)
  local taken, a, b
  local state = redis.call('GET', key)
  if state and #state == 25 then
    local tag, t, sa, sb = struct.unpack('<Bddd', state)
    if tag == 3 then taken, a, b = t, sa, sb end
  end
  if not taken then
    taken, a, b = 0, now, 0
  else
    local elapsed = (now - a) * q - b  -- since the last refill, in 1/Q us
    if elapsed > 0 then  -- (a clock that went back refills nothing)
      local refill = idiv(elapsed, p)
      if refill >= taken then
        taken, a, b = 0, now, 0
      else
        local nb = b + refill * p
        taken, a, b = taken - refill, a + idiv(nb, q), nb - idiv(nb, q) * q
      end
    end
  end
  -- (more taken than a capacity lowered in settings: no tokens until enough have refilled)
  local tokens = capacity - taken
  -- microseconds from now until K more tokens have arrived (rounded up: never too early)
  local function until_tokens(k)
    local scaled = (a - now) * q + b + k * p
    if scaled <= 0 then return 0 end
    return cdiv(scaled, q)
  end
  if tokens < cost then  -- so tokens < capacity: the bucket is refilling
    return false, math.max(0, tokens), until_tokens(capacity - tokens),
      until_tokens(cost - tokens)
  end
  if consume then tokens = tokens - cost end
  local full_in = 0
  if tokens < capacity then full_in = until_tokens(capacity - tokens) end
  if consume then
    redis.call('SET', key, struct.pack('<Bddd', 3, capacity - tokens, a, b), 'PX',
               ttl_ms(full_in))
  end
  return true, tokens, full_in, 0
end
