-- Rate-limit decision for one or more policies in one call: the gating policies all-or-nothing
-- among themselves, the others (soft: block=False) each on its own.
--
-- KEYS[i]  the state key of policy i (one key per policy, all distinct; same hash tag for a
--          cluster call).
-- ARGV[1]  "hit" (consume what is allowed, see below), "peek" (write nothing), or "soft" (a
--          hit whose gating policies are already denied by the caller: only soft ones consume).
-- ARGV[2]  "" to read the server clock with TIME; "+N" for the server clock N microseconds
--          ahead (the testing helpers' advance()); or the time itself, in microseconds (tests
--          inject it). Production sends "".
-- Then six ARGV per policy i, starting at ARGV[3 + 6 * (i - 1)]:
--   algorithm code ("fw", "sl", "sw", "tb", "lb", "gc", "cc"),
--   limit (count per period, or capacity/burst, or slots),
--   param (period or lease timeout in integer microseconds; for the buckets the numerator p
--          of the interval between requests, p / q microseconds),
--   cost (integer >= 1, at most limit),
--   extra (a unique nonce for "sl", the lease id for "cc", q for the buckets, otherwise ""),
--   gate ("1": a denial by this policy denies the request, "0": it only marks it).
--
-- Returns four integers per policy: allowed (1/0), remaining, reset_after (us),
-- retry_after (us; 0 when allowed). On a hit, a gating policy consumes only when every gating
-- policy allows (a request denied by one consumes nothing from the others); a soft policy
-- consumes whenever it allows, whatever the others decided.

local ALGORITHMS = {}

--#include lib/common.lua
--#include lib/fixed_window.lua
--#include lib/sliding_log.lua
--#include lib/sliding_window.lua
--#include lib/token_bucket.lua
--#include lib/leaky_bucket.lua
--#include lib/gcra.lua
--#include lib/concurrency.lua
--#include lib/decide_one.lua
--#include lib/decide_all.lua

--#per-call
return decide_all(KEYS, ARGV)
