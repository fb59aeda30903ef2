-- gcra ("gc"): the generic cell rate algorithm; one value per key, the theoretical arrival time
-- (TAT). The emission interval is P / Q microseconds exactly (the rate's period over its count,
-- reduced), so a rate of 10^7/s is P = 1, Q = 10, with no rounding to whole microseconds.
-- A request of COST is admitted if TAT + cost * interval - now <= burst * interval.
-- Key: a, b, the TAT being a + b / Q microseconds (0 <= b < Q), packed: struct '<I7I5'
-- (12 bytes, kept in the key's own allocation) while a < 2^53 and b < 2^40, else '<dd' (16
-- bytes, the previous release's only form, still read); expires when the TAT passes (the state
-- is full again). Arithmetic is done in units of 1/Q us, in integers.
-- Params: limit = burst (requests admitted back to back from rest), param = P, cost, extra = Q.
-- An algorithm block (see ratelimit.lua).
do
  local p, q = param, extra + 0
  local a, b = now, 0
  local state = redis.call('GET', key)
  if state then
    if #state == 12 then a, b = struct.unpack('<I7I5', state)
    elseif #state == 16 then a, b = struct.unpack('<dd', state) end
    -- Not a TAT we write (another writer's value): no state, never a wait of centuries. (B is
    -- below the Q it was written with, which a changed rate changes: below 2^53, as every Q.)
    if not (a > -9007199254740992 and a < 9007199254740992 and b >= 0
            and b < 9007199254740992) then
      a, b = now, 0
    end
  end
  if a < now then a, b = now, 0 end  -- a TAT in the past: the bucket is full
  local lead = (a - now) * q + b      -- TAT - now, in 1/Q us
  local step = cost * p
  local tolerance = limit * p
  allowed, retry = lead + step <= tolerance, 0
  if not allowed then
    retry = math.ceil((lead + step - tolerance) / q)
  elseif consume then
    local nb = b + step
    local whole = math.floor(nb / q)
    a, b = a + whole, nb - whole * q
    lead = lead + step
  end
  remaining, reset = math.floor((tolerance - lead) / p), math.ceil(lead / q)
  if allowed and consume then
    local packed
    if a >= 0 and a < 9007199254740992 and b < 1099511627776 and a % 1 == 0 then
      packed = struct.pack('<I7I5', a, b)
    else
      packed = struct.pack('<dd', a, b)
    end
    -- (LEAD >= STEP >= 1 after a hit, so RESET >= 1 us, and its ceiling in ms >= 1)
    redis.call('SET', key, packed, 'PX', math.ceil(reset / 1000))
  end
end
