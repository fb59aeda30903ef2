-- Give back what one admitted rate-limit hit took: a count_failures policy counts only the
-- requests that failed, so the hit of a request that did not fail is refunded once its response
-- is known (django_redislua/limiting/refund.py). The state becomes what it would be had the hit
-- never happened: exactly for what is left of the budget; its expiry within the time between
-- the hit and this call (see each algorithm below). Never more than the hit took.
--
-- KEYS[1]  the policy's state key for the identity (written by ratelimit*.lua).
-- KEYS[2]  the identity's override hash (lib/override.lua; the same hash tag as KEYS[1]).
-- ARGV[1]  "" to read the server clock with TIME; "+N" for TIME N microseconds ahead (the testing
--          helpers' advance()); or the time itself, in microseconds (tests inject it).
-- ARGV[2]  the algorithm code ("fw", "sl", "sw", "tb", "lb", "gc", "ca"; never "cc").
-- ARGV[3]  the policy's own limit; ARGV[4] its param; ARGV[5] its extra (as ratelimit.lua's:
--          for a calendar policy the boundaries of the periods around this call).
-- ARGV[6]  the policy's name (its field in the override hash).
-- ARGV[7]  the cost the hit consumed (>= 1).
-- ARGV[8]  the limit the hit was decided with (the policy's, or a live override's changed rate).
-- ARGV[9]  "r" when a live override changed the hit's rate, else "".
-- ARGV[10] the hit's reset_after (us), from its reply.
-- ARGV[11] microseconds the app measured from the hit's reply to this call (its local clock):
--          at most the server time between the hit and this call, which is that plus the
--          round trips' halves, DELAY. So LATEST = now - ARGV[11] is the hit's server time at the
--          latest, and at most DELAY after it.
--
-- Returns 1 when something was given back, 0 when nothing was: the hit's window has ended, the
-- state expired or was reset, or the rate is no longer the one the hit was decided with (a live
-- override set, changed or ended since: nothing is given back under other numbers).
--
-- The windows locate the hit by LATEST, within half a period: windows of one key are a period
-- apart, so the right one is found while DELAY is below half the period (policy.py requires a
-- period of at least 1 s for count_failures; a rate callable's rate is not checked). The buckets
-- give back the hit's cost of the level (1/Q us: gcra's TAT, the leaky bucket's water, the
-- token bucket's time until full, which is the same quantity), but no more than the level the
-- hit left (its reset_after) less the time since: what of the hit has not drained yet when no
-- hit came after it. A later hit can only keep more of it undrained (what it adds keeps the
-- level up), so this never gives back more than the hit still weighs; the hit's full cost when
-- its reset_after shows the level was higher before it than the time since (a busy bucket).
-- Otherwise (the bucket was nearly full before the hit, and another hit came meanwhile) the
-- refund is short by at most the time since the hit: the safe side.
--
-- Each stored form of each algorithm (lib/<algorithm>.lua says which) is read. The windows are
-- written back in the form they were read in, keeping their expiry (SET KEEPTTL, or INCRBY on
-- the decimal forms), but for a fixed window restarted (below); the buckets as a decision
-- writes them, with the shorter expiry their lower level calls for. A state left empty is
-- deleted. Bounded: the log's searches halve it; the entries removed are at most the cost.
local now = ARGV[1]
--#include lib/clock.lua
local key, ovkey, code, name = KEYS[1], KEYS[2], ARGV[2], ARGV[6]
local limit, param, extra = ARGV[3] + 0, ARGV[4] + 0, ARGV[5]
--#include lib/override.lua
if (override == 'r') ~= (ARGV[9] == 'r') or limit ~= ARGV[8] + 0 then return 0 end
local cost, reset, elapsed = ARGV[7] + 0, ARGV[10] + 0, ARGV[11] + 0
local latest = now - elapsed
local half = math.floor(param / 2)

if code == 'fw' then
  local period, start, count, size = param, nil, 0, 0
  local state = redis.call('GET', key)
  if state then
    size = #state
    if size == 19 then start, count = string.sub(state, 1, 16) + 0, string.sub(state, 17) + 0
    elseif size == 12 then start, count = struct.unpack('<I7I5', state)
    elseif size == 16 then start, count = struct.unpack('<dd', state) end
  end
  -- The hit's window ended at LATEST + RESET at the latest (RESET: what was left of it then);
  -- the stored window is another one when its end is half a period or more from that.
  if not start or now >= start + period
      or math.abs(start + period - (latest + reset)) >= half then
    return 0
  end
  local back = math.min(cost, count)
  if back <= 0 then return 0 end
  count = count - back
  if count == 0 then
    redis.call('DEL', key)
  elseif reset == period then
    -- The refunded hit opened the window (what was left of it was all of it). Without it, the
    -- next of the hits left would have opened it, after the hit and at or before now: the
    -- window starts again now, ending late by at most the time since the hit, never early.
    start = now
    local packed
    if override ~= 'r' and count < 1000 and start >= 1e15 and start < 9.2e15 then
      packed = string.format('%d%03d', start, count)
    elseif start >= 0 and start < 9007199254740992 and count < 1099511627776 then
      packed = struct.pack('<I7I5', start, count)
    else
      packed = struct.pack('<dd', start, count)
    end
    redis.call('SET', key, packed, 'PX', math.ceil(period / 1000))
  elseif size == 19 then
    redis.call('INCRBY', key, -back)  -- the count's digits, in place: the expiry stays
  elseif size == 12 then
    redis.call('SET', key, struct.pack('<I7I5', start, count), 'KEEPTTL')
  else
    redis.call('SET', key, struct.pack('<dd', start, count), 'KEEPTTL')
  end
  return 1

elseif code == 'ca' then
  -- The hit's period is the one holding LATEST among the boundaries sent (EXTRA, as a
  -- decision's: lib/calendar.lua); nothing is given back once the stored period is another.
  local b1, b2, b0, b3 = string.match(extra, '^(%d+),(%d+),(%d+),(%d+)$')
  if not b0 then return 0 end
  b0, b1, b2, b3 = b0 * 1000000, b1 * 1000000, b2 * 1000000, b3 * 1000000
  local start
  if latest >= b1 and latest < b2 then start = b1
  elseif latest >= b0 and latest < b1 then start = b0
  elseif latest >= b2 and latest < b3 then start = b2
  else return 0 end
  local state = redis.call('GET', key)
  if not state then return 0 end
  local stored, count
  if #state == 19 then
    stored, count = string.sub(state, 1, 10) * 1000000, string.sub(state, 11) + 0
  else
    local s, c = string.match(state, '^(%d+):(%d+)$')
    stored, count = s * 1000000, c + 0
  end
  if stored ~= start then return 0 end
  local back = math.min(cost, count)
  if back <= 0 then return 0 end
  count = count - back
  if count == 0 then
    redis.call('DEL', key)
  elseif #state == 19 then
    redis.call('INCRBY', key, -back)  -- the count's digits, in place: the expiry stays
  else
    redis.call('SET', key, string.format('%d:%d', stored / 1000000, count), 'KEEPTTL')
  end
  return 1

elseif code == 'sw' then
  local period, stored, cur, prev, size = param, nil, 0, 0, 0
  local state = redis.call('GET', key)
  if state then
    size = #state
    if size == 19 then
      stored = string.sub(state, 1, 13) * 1000
      cur, prev = string.sub(state, 14, 16) + 0, string.sub(state, 17) + 0
    elseif size == 12 then
      stored, cur, prev = struct.unpack('<I6I3I3', state)
      stored = stored * 1000
    elseif size == 24 then
      stored, cur, prev = struct.unpack('<ddd', state)
    end
  end
  if not stored or now >= stored + 2 * period then return 0 end  -- no count weighs any more
  -- An admitted hit's reset_after is 2 * PERIOD less its time into its window, so that offset
  -- is exact; only which window remains, and LATEST places the hit within half a period.
  local offset = 2 * period - reset
  if offset < 0 or offset >= period then return 0 end  -- not an admitted hit's reply
  local around = latest + half - offset
  local window = around - around % period  -- the hit's window (aligned to PERIOD)
  local back, current = 0, stored == window
  if current then
    back = math.min(cost, cur)
    cur = cur - back
  elseif stored == window + period then  -- a later hit moved it to the previous count
    back = math.min(cost, prev)
    prev = prev - back
  end
  if back <= 0 then return 0 end
  if cur == 0 and prev == 0 then
    redis.call('DEL', key)
  elseif size == 19 then
    redis.call('INCRBY', key, current and -1000 * back or -back)  -- in place: the expiry stays
  elseif size == 12 then
    redis.call('SET', key, struct.pack('<I6I3I3', stored / 1000, cur, prev), 'KEEPTTL')
  else
    redis.call('SET', key, struct.pack('<ddd', stored, cur, prev), 'KEEPTTL')
  end
  return 1

elseif code == 'sl' then
  -- The hit's entries are timed at its server time, within half a period before LATEST: the
  -- COST newest entries timed after LOW and at or before LATEST are removed. They are the hit's,
  -- or, when other hits came within DELAY after it, entries at most DELAY newer than the hit's:
  -- the count is exact either way, the log ages out at most DELAY later or earlier.
  local period = param
  local horizon = now - period
  local low = math.max(horizon, latest - half)
  local log = redis.pcall('GET', key)  -- false for no key
  if not log then return 0 end
  if type(log) == 'table' then  -- WRONGTYPE: the sorted set form
    local back, top = 0, latest
    local after = string.format('(%d', low)
    while back < cost do
      local newest = redis.call('ZREVRANGEBYSCORE', key, top, after, 'WITHSCORES', 'LIMIT', 0, 1)
      if #newest == 0 then break end
      local at = newest[2]
      -- Every entry of that time, its number ("<time>:<n>") highest first: a later hit at this
      -- very time numbers its entries from the live count up, so taking the highest keeps the
      -- members unique. (At most the limit: entries of one time are live entries.)
      local same = redis.call('ZRANGEBYSCORE', key, at, at)
      local function number(member) return tonumber(string.match(member, ':(%d+)$')) or 0 end
      table.sort(same, function(x, y) return number(x) > number(y) end)
      local take = math.min(cost - back, #same)
      for i = 1, take, 1000 do  -- (unpack() of more than a few thousand exceeds Lua's C stack)
        redis.call('ZREM', key, unpack(same, i, math.min(take, i + 999)))
      end
      back, top = back + take, '(' .. at
    end
    if back == 0 then return 0 end
    if redis.call('ZCOUNT', key, string.format('(%d', horizon), '+inf') == 0 then
      redis.call('DEL', key)
    end
    return 1
  end
  -- The small form: 7-byte times in time order.
  local n = #log / 7
  local function first_after(t)  -- the first entry timed after T (N + 1: none)
    local lo, hi = 1, n + 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if struct.unpack('<I7', log, 7 * mid - 6) > t then hi = mid else lo = mid + 1 end
    end
    return lo
  end
  local first, top = first_after(horizon), first_after(latest) - 1
  local from = math.max(first_after(low), top - cost + 1)
  if top < from then return 0 end
  -- the live entries but FROM..TOP (the aged-out ones before FIRST are dropped on the way)
  log = string.sub(log, 7 * first - 6, 7 * from - 7) .. string.sub(log, 7 * top + 1)
  if log == '' then
    redis.call('DEL', key)
  else
    redis.call('SET', key, log, 'KEEPTTL')
  end
  return 1

elseif code == 'gc' then
  local p, q = param, extra + 0
  local state = redis.call('GET', key)
  local a, b
  if state then
    if #state == 12 then a, b = struct.unpack('<I7I5', state)
    elseif #state == 16 then a, b = struct.unpack('<dd', state) end
  end
  if not a then return 0 end
  local lead = (a - now) * q + b  -- TAT - now, in 1/Q us
  local give = math.min(cost * p, lead, (reset - elapsed) * q)
  if give <= 0 then return 0 end
  lead = lead - give
  if lead <= 0 then
    redis.call('DEL', key)
    return 1
  end
  local nb = b - give
  local whole = math.floor(nb / q)
  a, b = a + whole, nb - whole * q
  local packed
  if a >= 0 and a < 9007199254740992 and b < 1099511627776 and a % 1 == 0 then
    packed = struct.pack('<I7I5', a, b)
  else
    packed = struct.pack('<dd', a, b)
  end
  redis.call('SET', key, packed, 'PX', math.ceil(math.ceil(lead / q) / 1000))
  return 1

elseif code == 'lb' then
  local p, q = param, extra + 0
  local state = redis.call('GET', key)
  local level, at
  if state then
    if #state == 12 then level, at = struct.unpack('<I5I7', state)
    elseif #state == 16 then level, at = struct.unpack('<dd', state) end
  end
  if not level then return 0 end
  if now > at then
    level, at = level - (now - at) * q, now
    if level < 0 then level = 0 end
  end
  local lag = at - now  -- 0 unless the clock went back (see lib/leaky_bucket.lua)
  local give = math.min(cost * p, level, (reset - elapsed) * q)
  if give <= 0 then return 0 end
  level = level - give
  if level <= 0 then
    redis.call('DEL', key)
    return 1
  end
  local packed
  if level < 1099511627776 and at >= 0 and at < 9007199254740992 and at % 1 == 0 then
    packed = struct.pack('<I5I7', level, at)
  else
    packed = struct.pack('<dd', level, at)
  end
  redis.call('SET', key, packed, 'PX', math.ceil((math.ceil(level / q) + lag) / 1000))
  return 1

elseif code == 'tb' then
  local p, q = param, extra + 0
  local state = redis.call('GET', key)
  local taken, a, b
  if state then
    if #state == 12 then taken, a, b = struct.unpack('<I4I7I1', state)
    elseif #state == 24 then taken, a, b = struct.unpack('<ddd', state) end
  end
  if not taken then return 0 end
  -- Until the bucket is full (1/Q us): the level, as gcra's TAT - now. The tokens refilled
  -- since the last refill (LEAD before now) do not change it: no refill to compute here.
  local lead = (a - now) * q + b
  local full = lead + taken * p
  local give = math.min(cost * p, full, (reset - elapsed) * q)
  if give <= 0 then return 0 end
  full = full - give
  if full <= 0 then
    redis.call('DEL', key)
    return 1
  end
  -- Tokens arrive whole: KEPT tokens taken and a refill point in (now - P, now] make FULL (the
  -- refill point keeps its phase when GIVE is whole tokens, as it is unless the bound cut it).
  local kept = math.ceil(full / p)
  local nb = b + (full - kept * p) - lead
  local whole = math.floor(nb / q)
  taken, a, b = kept, a + whole, nb - whole * q
  local packed
  if taken < 4294967296 and a >= 0 and a < 9007199254740992 and b < 256 and a % 1 == 0 then
    packed = struct.pack('<I4I7I1', taken, a, b)
  else
    packed = struct.pack('<ddd', taken, a, b)
  end
  redis.call('SET', key, packed, 'PX', math.ceil(math.ceil(full / q) / 1000))
  return 1
end
return redis.error_reply('ERR redislua: no refund for algorithm ' .. tostring(code))
