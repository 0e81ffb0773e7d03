-- kvgate usage ledger: one tenant's share of one flush, applied once. Run with EVALSHA, one call per
-- tenant per flush, all in one pipeline (gateway/stores/ledger_store.py).
--
-- KEYS[1]      the batch marker: `{prefix}{tenant}:usage:batch:<gateway id>:<sequence>`. A flush whose
--              answer was lost is retried with the same marker; if it was applied, the marker is
--              there and nothing is counted twice.
-- KEYS[2..]    the tenant's hour hashes `{prefix}{tenant}:usage:<hour start, Unix seconds>`, fields
--              `<key>:<metric>:<model>` holding whole numbers
-- ARGV[1]      the marker's lifetime in seconds
-- ARGV[2..]    per hour hash, in KEYS order: expire_at (Unix seconds, the hour's end + retention),
--              the number of fields n, then n pairs (field, increment)
-- Reply        1 when applied, 0 when this batch had been applied already

if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[1])) then
  return 0
end
local j = 2
for i = 2, #KEYS do
  local expire_at = tonumber(ARGV[j])
  local n = tonumber(ARGV[j + 1])
  j = j + 2
  for _ = 1, n do
    redis.call('HINCRBY', KEYS[i], ARGV[j], ARGV[j + 1])
    j = j + 2
  end
  redis.call('EXPIREAT', KEYS[i], expire_at)
end
return 1
