-- Rate-limit decision for one or more policies in one call: the gating policies all-or-nothing
-- among themselves, the others (soft: block=False) each on its own.
--
-- KEYS[i]  the state key of policy i (one key per policy, all distinct; same hash tag for a
--          cluster call), for i = 1..N; then KEYS[N + i], the override hash of policy i's
--          identity (lib/override.lua; the same hash tag as its state key).
-- ARGV[1]  "hit" (consume what is allowed, see below), "peek" (write nothing), or "soft" (a
--          hit whose gating policies are already denied by the caller: only soft ones consume).
-- ARGV[2]  "" to read the server clock with TIME; "+N" for the server clock N microseconds
--          ahead (the testing helpers' advance()); or the time itself, in microseconds (tests
--          inject it). Production sends "".
-- Then seven ARGV per policy i, starting at ARGV[3 + 7 * (i - 1)]:
--   algorithm code ("fw", "sl", "sw", "tb", "lb", "gc", "cc", "ca"),
--   limit (count per period, or capacity/burst, or slots),
--   param (period or lease timeout in integer microseconds; for the buckets the numerator p
--          of the interval between requests, p / q microseconds),
--   cost (integer >= 1, at most limit),
--   extra (the lease id for "cc", q for the buckets, the periods' boundaries for "ca"
--          (lib/calendar.lua), otherwise ""),
--   gate ("1": a denial by this policy denies the request, "0": it only marks it),
--   name (the policy's, its field in the override hash).
-- Then, for the M policies (0 <= M <= N) at a rate their rate callable gave: KEYS[2N + j] the
-- key keeping that rate (j = 1..M), and two ARGV after the policies', ARGV[2 + 7N + 2j - 1] the
-- index i of its policy and ARGV[2 + 7N + 2j] its record. (So N is (#ARGV - 2 - 2 * #KEYS) / 3;
-- a call without kept rates is the layout above, unchanged.)
--
-- Returns six integers per policy: allowed (1/0, plus 2 when a live override answered, 4 when
-- it changed the rate), remaining, reset_after (us), retry_after (us; 0 when allowed), the
-- limit decided with (the policy's, or a changed rate's), and how long the override lasts (us;
-- 0 without one). A retry_after of -1: no wait admits
-- the cost (above a changed rate's capacity). On a hit, a gating policy consumes only when every gating
-- policy allows (a request denied by one consumes nothing from the others); a soft policy
-- consumes whenever it allows, whatever the others decided.
--
-- Each algorithm is a block in lib/ (included whole here and in its single-policy script,
-- ratelimit_<code>.lua) that reads the locals key, now, limit, param, cost, extra, consume
-- (true: write the new state if allowed; false: only read, so the driver can decide several
-- policies before committing any) and own_rate (true: limit and param are the policy's own;
-- false: a live override changed them, which the windows' in-place hit must know) and sets
-- allowed (boolean), remaining, reset (reset_after, us) and retry (retry_after, us). A block
-- writes only when consume is true and the request is allowed. Here they are the branches of one
-- function of those inputs, decide_policy, defined once per Functions library.
--
-- Kept rates: a policy whose rate is a callable (per-plan rates) is decided at the rate it gives
-- per request, which nothing outside the request knows; the admin could not peek at such a
-- state. So a decision at such a rate that consumes (writes the state) also writes the rate's
-- record beside it, "<KEY_PREFIX>:<policy name>:rt:{<identity tag>}" (the state's hash tag; "rt"
-- is no algorithm code, so it is never taken for a state key), expiring with the state
-- (lib/keep_rate.lua). The record is "CODE|LIMIT|PARAM|EXTRA|RATE": the algorithm code, the
-- limit, param and extra the rate decides with (as ARGV sends them) and its text ("100/h"): the
-- callable's rate, not a live override's (an override's changed rate decides instead of it, and
-- the record still names the callable's). A fixed rate keeps nothing and sends nothing more.
--
-- Times and durations are integer microseconds held in Lua numbers (doubles, exact below 2^53).
-- Numbers passed straight to redis.call are sent exactly ("%.17g"); only concatenation needs
-- string.format('%.0f'), since Lua's tostring would print 1.7e+15 for a timestamp. Integer
-- quotients are math.floor(a / b) and math.ceil(a / b), exact for integers |a| < 2^53, b >= 1:
-- a quotient that is not an integer is at least 1/b from the nearest one, farther than the
-- rounding of a / b (|a / b| * 2^-53 < 1/b) can move it. The buckets' products stay below
-- 2^51 (redislua.E007).

-- One policy decided by its algorithm's block; nil for an unknown algorithm code.
local function decide_policy(code, key, now, limit, param, cost, extra, consume, own_rate)
  local allowed, remaining, reset, retry
  if code == 'fw' then
--#include lib/fixed_window.lua
  elseif code == 'sl' then
--#include lib/sliding_log.lua
  elseif code == 'sw' then
--#include lib/sliding_window.lua
  elseif code == 'tb' then
--#include lib/token_bucket.lua
  elseif code == 'lb' then
--#include lib/leaky_bucket.lua
  elseif code == 'gc' then
--#include lib/gcra.lua
  elseif code == 'cc' then
--#include lib/concurrency.lua
  elseif code == 'ca' then
--#include lib/calendar.lua
  else
    return nil
  end
  return allowed, remaining, reset, retry
end

--#include lib/decide_all.lua

--#per-call
return decide_all(KEYS, ARGV)
