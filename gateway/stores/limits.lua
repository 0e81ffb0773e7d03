-- kvgate admission: a request's token buckets and quota counters, checked and written in ONE atomic
-- call (runs after bucket.lua and quota.lua in the same script). All or nothing: a take debits every
-- bucket and every counter, or none.
--
-- KEYS[1..n]        the buckets' states; KEYS[n+1..n+m] the quota counters'
-- ARGV[1]           "take" | "settle" | "peek"
-- ARGV[2]           now in seconds for the buckets, or "" to read the Redis server's TIME (so every
--                   gateway refills one bucket alike)
-- ARGV[3]           n, the number of buckets
-- ARGV[4 + 4(i-1)..] capacity, refill_per_s, a, b of bucket i
-- then, one argument per counter: "limit a b ttl_ms warn_level" (warn_level -1: none), one string
--                   rather than five, which halves what the client encodes per counter
--                   take: a = amount; settle: a = reserved, b = actual; peek: unused
-- Reply  {allowed, too_large, retry_after, (level, reset, wait) per bucket, then, when there are
--         counters, two more: every counter's `used` separated by spaces, and one flag character
--         per counter: 'r' refused, 'w' crossed its warn level, '-' neither} as strings

local op = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[2])
end

local n = tonumber(ARGV[3])
local m = #KEYS - n
local cap, rate, a, b, level, updated = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local j = 4 + 4 * (i - 1)
  cap[i] = tonumber(ARGV[j])
  rate[i] = tonumber(ARGV[j + 1])
  a[i] = tonumber(ARGV[j + 2])
  b[i] = tonumber(ARGV[j + 3])
  level[i], updated[i] = bucket_refilled(KEYS[i], cap[i], rate[i], now)
end
local qlimit, qa, qb, qttl, qwarn, used, warned, exists = {}, {}, {}, {}, {}, {}, {}, {}
for k = 1, m do
  local l, x, y, t, w = string.match(ARGV[4 + 4 * n + (k - 1)], '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  qlimit[k] = tonumber(l)
  qa[k] = tonumber(x)
  qb[k] = tonumber(y)
  qttl[k] = tonumber(t)
  qwarn[k] = tonumber(w)
  used[k], warned[k], exists[k] = quota_load(KEYS[n + k], qttl[k])
end

local allowed, too_large, retry = 1, 0, 0
local wait, refused, crossed = {}, {}, {}
for i = 1, n do
  wait[i] = 0
end
for k = 1, m do
  refused[k] = 0
  crossed[k] = 0
end

local function note_warning(k)
  local c
  warned[k], c = quota_warn(used[k], warned[k], qwarn[k])
  if c then
    crossed[k] = 1
  end
end

if op == 'take' then
  for i = 1, n do
    local w = bucket_wait(level[i], cap[i], rate[i], a[i])
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
  for k = 1, m do
    if used[k] + qa[k] > qlimit[k] then  -- would this exceed?
      refused[k] = 1
      allowed = 0
    end
  end
  if allowed == 1 then
    for i = 1, n do
      level[i] = level[i] - a[i]
    end
    for k = 1, m do
      used[k] = used[k] + qa[k]
      note_warning(k)
      quota_write(KEYS[n + k], used[k], warned[k], qttl[k])
    end
  end
elseif op == 'settle' then
  for i = 1, n do
    level[i] = math.min(cap[i], level[i] + (a[i] - b[i]))
  end
  for k = 1, m do
    if exists[k] then  -- a counter whose window is over stays missing
      used[k] = math.max(0, used[k] + (qb[k] - qa[k]))
      note_warning(k)
      quota_write(KEYS[n + k], used[k], warned[k], qttl[k])
    end
  end
elseif op ~= 'peek' then
  return redis.error_reply('limits.lua: unknown op ' .. tostring(op))
end

local reply = {tostring(allowed), tostring(too_large), fmt(retry)}
for i = 1, n do
  local reset = (cap[i] - level[i]) / rate[i]
  if op ~= 'peek' then
    bucket_write(KEYS[i], level[i], updated[i], cap[i], rate[i])
  end
  reply[#reply + 1] = fmt(level[i])
  reply[#reply + 1] = fmt(reset)
  reply[#reply + 1] = fmt(wait[i])
end
if m > 0 then
  local u, f = {}, {}
  for k = 1, m do
    u[k] = fmt(used[k])
    if refused[k] == 1 then
      f[k] = 'r'
    elseif crossed[k] == 1 then
      f[k] = 'w'
    else
      f[k] = '-'
    end
  end
  reply[#reply + 1] = table.concat(u, ' ')
  reply[#reply + 1] = table.concat(f)
end
return reply
