-- leaky_bucket ("lb"): the meter form. Each request pours one interval (P / Q us exactly) of
-- water into a bucket of LIMIT intervals that drains continuously, one microsecond of water per
-- microsecond. A request is admitted while its water fits. Denied requests pour nothing.
-- Water is counted in units of 1/Q us, in integers.
-- Key: the water level (1/Q us) and the time it was measured (us), packed: struct '<I5I7'
-- (12 bytes, kept in the key's own allocation) while the level is below 2^40 and the time below
-- 2^53, else '<dd' (16 bytes, the previous release's only form, still read); expires when empty.
-- Params: limit = capacity in requests (burst), param = P, cost, extra = Q.
-- An algorithm block (see ratelimit.lua).
do
  local p, q = param, extra + 0
  local level, at = 0, now
  local state = redis.call('GET', key)
  if state then
    if #state == 12 then level, at = struct.unpack('<I5I7', state)
    elseif #state == 16 then level, at = struct.unpack('<dd', state) end
    -- Not a level and time we write (another writer's value): no state (an empty bucket).
    -- (The level is at most the capacity it was written under, LIMIT x P <= 2^51: definition.py).
    if not (at > -9007199254740992 and at < 9007199254740992 and level >= 0
            and level < 9007199254740992) then
      level, at = 0, now
    end
  end
  if now > at then
    level, at = level - (now - at) * q, now
    if level < 0 then level = 0 end
  end
  -- A clock that went back (now < at) drains nothing, and the level stays measured at AT, so the
  -- time between now and at is never drained twice.
  local lag = at - now  -- 0 unless the clock went back: the draining resumes only at AT
  local size = limit * p
  local poured = level + cost * p
  allowed, retry = poured <= size, 0
  if not allowed then
    retry = math.ceil((poured - size) / q) + lag
  elseif consume then
    level = poured
  end
  remaining, reset = math.floor((size - level) / p), math.ceil(level / q) + lag
  if allowed and consume then
    -- (LEVEL >= cost * p >= 1 after a hit and LAG >= 0: RESET >= 1, its ceiling in ms >= 1)
    local packed
    if level < 1099511627776 and at >= 0 and at < 9007199254740992 and at % 1 == 0 then
      packed = struct.pack('<I5I7', level, at)
    else
      packed = struct.pack('<dd', level, at)
    end
    redis.call('SET', key, packed, 'PX', math.ceil(reset / 1000))
  end
end
