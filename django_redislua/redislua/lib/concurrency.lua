-- concurrency ("cc"): at most LIMIT requests in flight. Each admitted request holds a lease that
-- expires after TIMEOUT if never released (a crashed holder frees its own slot).
-- Key: a sorted set, member = lease id, score = lease expiry (us); expires with its last lease.
-- Params: limit = slots, param = lease timeout (us), cost = 1, extra = the lease id to add.
ALGORITHMS['cc'] = function(key, now, limit, timeout, cost, extra, consume)
  local held = redis.call('ZCOUNT', key, '(' .. int(now), '+inf')
  local allowed = held + cost <= limit
  local used = held
  if allowed and consume then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    redis.call('ZADD', key, now + timeout, extra)
    used = held + cost
  end
  local reset, retry = 0, 0
  if used > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset = tonumber(last[2]) - now
    if allowed and consume then redis.call('PEXPIRE', key, ttl_ms(reset)) end
  end
  if not allowed then
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf',
                             'WITHSCORES', 'LIMIT', 0, 1)
    retry = tonumber(first[2]) - now
  end
  return allowed, limit - used, reset, retry
end
