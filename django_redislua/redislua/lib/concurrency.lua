-- concurrency ("cc"): at most LIMIT requests in flight. Each admitted request holds a lease that
-- expires after TIMEOUT if never released (a crashed holder frees its own slot).
-- Key: a sorted set, member = lease id, score = lease expiry (us); expires with its last lease.
-- Params: limit = slots, param = lease timeout (us), cost = 1, extra = the lease id to add.
-- An algorithm block (see ratelimit.lua). Scores go in as exact integers ('%.0f': Lua's own
-- tostring would print 1.7e+15 for a timestamp).
do
  local timeout = param
  local after = string.format('(%.0f', now)
  local held = redis.call('ZCOUNT', key, after, '+inf')
  allowed, reset, retry = held + cost <= limit, 0, 0
  local used = held
  if allowed and consume then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    redis.call('ZADD', key, now + timeout, extra)
    used = held + cost
  end
  if used > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset = tonumber(last[2]) - now
    -- (RESET >= TIMEOUT > 0 after a hit: its ceiling in ms is at least 1)
    if allowed and consume then redis.call('PEXPIRE', key, math.ceil(reset / 1000)) end
  end
  if not allowed then
    local first = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    retry = tonumber(first[2]) - now
  end
  remaining = limit - used
end
