-- sliding_log ("sl"): exact; at most LIMIT hits in any span of PERIOD. Stores one entry per hit.
-- Key: a sorted set, member = "<nonce>:<i>" (unique per call), score = hit time (us).
-- Params: limit = hits per period, param = period (us), cost = entries to add (<= limit),
-- extra = a nonce unique to this call, so concurrent hits in one microsecond stay distinct.
ALGORITHMS['sl'] = function(key, now, limit, period, cost, extra)
  local horizon = now - period
  local count = redis.call('ZCOUNT', key, '(' .. int(horizon), '+inf')
  local allowed = count + cost <= limit
  return {
    allowed = allowed,
    commit = function()
      redis.call('ZREMRANGEBYSCORE', key, '-inf', int(horizon))
      local args = {}
      for i = 1, cost do  -- bounded: cost <= limit is checked before the script runs
        args[#args + 1] = int(now)
        args[#args + 1] = extra .. ':' .. i
      end
      redis.call('ZADD', key, unpack(args))
      expire_us(key, period)
    end,
    report = function(committed)
      local used = count
      if committed then used = used + cost end
      local reset, retry = 0, 0
      if committed then
        reset = period
      elseif count > 0 then
        local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        reset = tonumber(newest[2]) + period - now
      end
      if not allowed then
        -- Wait until enough of the oldest live entries have aged out.
        local k = count + cost - limit
        local entry = redis.call('ZRANGEBYSCORE', key, '(' .. int(horizon), '+inf',
                                 'WITHSCORES', 'LIMIT', k - 1, 1)
        retry = tonumber(entry[2]) + period - now
      end
      return limit - used, reset, retry
    end,
  }
end
