-- The server clock (a block, included where a script reads its time): the includer declares
-- `local now = ARGV[i]`, the ARGV "now", and this turns it into integer microseconds: "" reads
-- TIME; "+N" is TIME moved N microseconds ahead (the testing helpers' advance()); anything else
-- is a time in microseconds that a test injects. A block, not a function: a script re-creates
-- every function it defines on each EVALSHA. Microseconds are exact in Lua's doubles below 2^53.
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif string.byte(now) == 43 then -- "+"
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2] + tonumber(string.sub(now, 2))
else
  now = tonumber(now)
end
