-- The recipes' clock (a fragment): NOW is ARGV "now" read as "" (the server's TIME), "+N" (TIME
-- moved N microseconds ahead: the testing helpers' advance()) or a time in microseconds that a
-- test injects. Microseconds are exact in Lua's doubles below 2^53.
local function clock_us(arg)
  if arg == '' or string.byte(arg) == 43 then -- "" or "+N"
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if arg == '' then return now end
    return now + tonumber(string.sub(arg, 2))
  end
  return tonumber(arg)
end
