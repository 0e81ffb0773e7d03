-- kvgate token buckets: policies/token_bucket.py line by line (Lua numbers are IEEE doubles, as Python
-- floats are), so both give the same levels bit for bit. Functions only: the script Redis runs is
-- this file, quota.lua and limits.lua joined in that order (gateway/stores/redis_store.py), one
-- EVALSHA per admission and one per settle.
--
-- A bucket's state: a hash {l = level, t = updated_at (seconds)}; a missing key is FULL.
-- Numbers are stored and returned with string.format('%.17g', x): Lua's tostring keeps only 14
-- significant digits, and Redis would truncate a Lua number in a reply to an integer.

local function fmt(x)
  return string.format('%.17g', x)
end

-- The bucket at `key` refilled to `now`: level, updated_at. A clock that goes backwards adds nothing
-- and does not move updated_at back.
local function bucket_refilled(key, cap, rate, now)
  local s = redis.call('HMGET', key, 'l', 't')
  local l, u
  if s[1] and s[2] then
    l = tonumber(s[1])
    u = tonumber(s[2])
  else
    l = cap
    u = now
  end
  local elapsed = now - u
  if elapsed < 0 then
    elapsed = 0
  end
  return math.min(cap, l + elapsed * rate), math.max(u, now)
end

-- Seconds until a bucket at `level` holds `a`: 0 if it already does, math.huge if it never can.
local function bucket_wait(level, cap, rate, a)
  if a > cap then
    return math.huge
  elseif level >= a then
    return 0
  end
  return (a - level) / rate
end

-- Store the state; the key expires when the bucket would be full again + 1 s (a missing key is a
-- full bucket, so expiry loses nothing), capped at ten years: a huge debt must not print as 1e+20,
-- which PEXPIRE refuses.
local function bucket_write(key, level, updated, cap, rate)
  redis.call('HSET', key, 'l', fmt(level), 't', fmt(updated))
  local reset = (cap - level) / rate
  redis.call('PEXPIRE', key, math.min(math.ceil(reset * 1000) + 1000, 315360000000))
  return reset
end
