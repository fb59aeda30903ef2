-- token_bucket ("tb"): a bucket of LIMIT tokens (the burst) refilled one token per interval of
-- P / Q microseconds exactly (the rate's period over its count, reduced: no rounding).
-- Tokens arrive whole; a full bucket stops the refill clock. Denied requests take nothing.
-- Key: the tokens taken and not yet refilled (so rules of different capacities sharing one
-- state agree on what was used), and the last refill at a + b / Q us (0 <= b < Q) as a, b,
-- packed: struct '<I4I7I1' (12 bytes, kept in the key's own allocation) while taken < 2^32,
-- a < 2^53 and b < 256, else '<ddd' (24 bytes, the previous release's only form, still read);
-- expires when the bucket is full again. Times are compared in units of 1/Q us.
-- Params: limit = capacity (burst), param = P, cost = tokens to take, extra = Q.
-- An algorithm block (see ratelimit.lua).
do
  local capacity, p, q = limit, param, extra + 0
  local taken, a, b
  local state = redis.call('GET', key)
  if state then
    if #state == 12 then taken, a, b = struct.unpack('<I4I7I1', state)
    elseif #state == 24 then taken, a, b = struct.unpack('<ddd', state) end
    -- Not a state we write (another writer's value): no state (a full bucket).
    -- (B is below the Q it was written with, which a changed rate changes: below 2^53.)
    if taken and not (a > -9007199254740992 and a < 9007199254740992 and b >= 0
                      and b < 9007199254740992 and taken >= 0 and taken < 9007199254740992) then
      taken = nil
    end
  end
  if not taken then
    taken, a, b = 0, now, 0
  else
    local elapsed = (now - a) * q - b  -- since the last refill, in 1/Q us
    if elapsed >= p then  -- a token at least (a clock that went back refills nothing)
      local refill = math.floor(elapsed / p)
      if refill >= taken then
        taken, a, b = 0, now, 0
      else
        local nb = b + refill * p
        local whole = math.floor(nb / q)
        taken, a, b = taken - refill, a + whole, nb - whole * q
      end
    end
  end
  -- (more taken than a capacity lowered in settings: no tokens until enough have refilled)
  local tokens = capacity - taken
  -- Microseconds from now until K more tokens have arrived are ceil((lead + K * p) / q), or 0
  -- when that is not positive (rounded up: never too early).
  local lead = (a - now) * q + b
  allowed, retry = tokens >= cost, 0
  if not allowed then  -- so tokens < capacity: the bucket is refilling
    local wait = lead + (cost - tokens) * p
    if wait > 0 then retry = math.ceil(wait / q) end
  elseif consume then
    tokens = tokens - cost
  end
  reset = 0
  if tokens < capacity then
    local full = lead + (capacity - tokens) * p
    if full > 0 then reset = math.ceil(full / q) end
  end
  if allowed and consume then
    -- (a token was taken and lead > -p, since less than one interval has passed since the last
    -- refill: RESET >= 1, so is its ceiling in ms)
    taken = capacity - tokens
    local packed
    if taken < 4294967296 and a >= 0 and a < 9007199254740992 and b < 256 and a % 1 == 0 then
      packed = struct.pack('<I4I7I1', taken, a, b)
    else
      packed = struct.pack('<ddd', taken, a, b)
    end
    redis.call('SET', key, packed, 'PX', math.ceil(reset / 1000))
  end
  remaining = tokens
end
