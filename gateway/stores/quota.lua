-- kvgate quota counters: policies/quota.py line by line. Functions only (see bucket.lua for how the
-- script is put together).
--
-- A counter's state (one quota in one calendar window): a hash {u = used, w = '1' once the warn level
-- was reported in this window}; a missing key is EMPTY (used 0, not warned). The gateway names the
-- window in the key and gives its remaining lifetime (the window's end + a grace for requests still
-- running, by the gateway's clock) as ttl_ms on every call.

-- used, warned, exists. A counter whose lifetime is over by the caller's clock counts as missing.
local function quota_load(key, ttl_ms)
  if ttl_ms <= 0 then
    return 0, false, false
  end
  local s = redis.call('HMGET', key, 'u', 'w')
  if s[1] then
    return tonumber(s[1]), s[2] == '1', true
  end
  return 0, false, false
end

-- warned after a write, and whether this write crossed `warn_level` (< 0: the quota has none)
local function quota_warn(used, warned, warn_level)
  if warn_level < 0 or warned or used < warn_level then
    return warned, false
  end
  return true, true
end

local function quota_write(key, used, warned, ttl_ms)
  if ttl_ms <= 0 then
    return
  end
  local w = '0'
  if warned then
    w = '1'
  end
  redis.call('HSET', key, 'u', fmt(used), 'w', w)
  redis.call('PEXPIRE', key, ttl_ms)
end
