-- sliding_log ("sl"): exact; at most LIMIT hits in any span of PERIOD. Stores one entry per hit.
-- Key: a sorted set, member = "<nonce>:<i>" (unique per call), score = hit time (us); expires
-- PERIOD after the newest hit.
-- Params: limit = hits per period, param = period (us), cost = entries to add (<= limit),
-- extra = a nonce unique to this call, so concurrent hits in one microsecond stay distinct.
-- An algorithm block (see ratelimit.lua). Scores go in as exact integers ('%.0f': Lua's own
-- tostring would print 1.7e+15 for a timestamp).
do
  local period = param
  local horizon = now - period
  local after = string.format('(%.0f', horizon)
  local count = redis.call('ZCOUNT', key, after, '+inf')
  allowed, reset, retry = count + cost <= limit, 0, 0
  remaining = limit - count
  if allowed and consume then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', horizon)
    -- One entry per unit of cost, added in chunks: unpack() of more than a few thousand values
    -- exceeds Lua's C stack. Bounded: the caller never sends a cost above the limit.
    local added = 0
    while added < cost do
      local chunk = math.min(cost - added, 1000)
      local args = {}
      for i = 1, chunk do
        args[2 * i - 1] = now
        args[2 * i] = extra .. ':' .. (added + i)
      end
      redis.call('ZADD', key, unpack(args))
      added = added + chunk
    end
    redis.call('PEXPIRE', key, math.ceil(period / 1000))
    remaining, reset = remaining - cost, period
  else
    if count > 0 then
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      reset = tonumber(newest[2]) + period - now
    end
    if not allowed then
      -- Wait until enough of the oldest live entries have aged out.
      local entry = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT',
                               count + cost - limit - 1, 1)
      retry = tonumber(entry[2]) + period - now
    end
  end
end
