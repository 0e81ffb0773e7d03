-- kvgate token buckets: one atomic check per call. Mirrors policies/token_bucket.py line by line
-- (Lua numbers are IEEE doubles, as Python floats are), so both give the same levels bit for bit.
--
-- KEYS[i]   one bucket's state: a hash {l = level, t = updated_at (seconds)}; a missing key is FULL.
-- ARGV[1]   "take" | "settle" | "peek"
-- ARGV[2]   now in seconds, or "" to read the Redis server's TIME (so every gateway shares one clock)
-- ARGV[3 + 4(i-1) ..]  capacity, refill_per_s, a, b of bucket i
--           take: a = amount (all buckets or none); settle: a = reserved, b = actual; peek: unused
-- Reply     {allowed, too_large, retry_after, level_1, reset_1, wait_1, level_2, ...} as strings:
--           Redis would truncate Lua numbers in a reply to integers, and %.17g round-trips a double.
-- Writes    take and settle store every bucket's refilled state and set its TTL to the time until
--           it is full again + 1 s (a missing key is a full bucket, so expiry loses nothing).

local op = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[2])
end

local function fmt(x)
  return string.format('%.17g', x)
end

local n = #KEYS
local cap, rate, a, b, level, updated = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local j = 3 + 4 * (i - 1)
  cap[i] = tonumber(ARGV[j])
  rate[i] = tonumber(ARGV[j + 1])
  a[i] = tonumber(ARGV[j + 2])
  b[i] = tonumber(ARGV[j + 3])
  local s = redis.call('HMGET', KEYS[i], 'l', 't')
  local l, u
  if s[1] and s[2] then
    l = tonumber(s[1])
    u = tonumber(s[2])
  else
    l = cap[i]
    u = now
  end
  -- refill: a clock that goes backwards adds nothing and does not move updated_at back
  local elapsed = now - u
  if elapsed < 0 then
    elapsed = 0
  end
  level[i] = math.min(cap[i], l + elapsed * rate[i])
  updated[i] = math.max(u, now)
end

local allowed, too_large, retry = 1, 0, 0
local wait = {}
for i = 1, n do
  wait[i] = 0
end

if op == 'take' then
  for i = 1, n do
    local w
    if a[i] > cap[i] then
      w = math.huge
    elseif level[i] >= a[i] then
      w = 0
    else
      w = (a[i] - level[i]) / rate[i]
    end
    wait[i] = w
    if w > 0 then
      allowed = 0
      if w > retry then
        retry = w
      end
    end
  end
  if retry == math.huge then
    too_large = 1
  end
  if allowed == 1 then
    for i = 1, n do
      level[i] = level[i] - a[i]
    end
  end
elseif op == 'settle' then
  for i = 1, n do
    level[i] = math.min(cap[i], level[i] + (a[i] - b[i]))
  end
elseif op ~= 'peek' then
  return redis.error_reply('bucket.lua: unknown op ' .. tostring(op))
end

local reply = {tostring(allowed), tostring(too_large), fmt(retry)}
for i = 1, n do
  local reset = (cap[i] - level[i]) / rate[i]
  if op ~= 'peek' then
    redis.call('HSET', KEYS[i], 'l', fmt(level[i]), 't', fmt(updated[i]))
    -- capped at ten years: a huge debt must not print as 1e+20, which PEXPIRE refuses
    redis.call('PEXPIRE', KEYS[i], math.min(math.ceil(reset * 1000) + 1000, 315360000000))
  end
  reply[#reply + 1] = fmt(level[i])
  reply[#reply + 1] = fmt(reset)
  reply[#reply + 1] = fmt(wait[i])
end
return reply
