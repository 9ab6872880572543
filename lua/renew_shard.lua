-- renew_shard: extend a lease the caller holds. The token stays the same. A lease is held
-- until it is taken back (after expiry, by the next acquire, or when its worker fails). The
-- renewal names the grant (token and grant id): another grant with the same token number
-- (issued again after a rollback) is not the caller's.
-- KEYS[1] = holders HASH   KEYS[2] = expiry ZSET
-- ARGV[1] = shard id   ARGV[2] = fencing token   ARGV[3] = lease time-to-live, ms
-- ARGV[4] = the grant id (acquire_shard's ARGV[8] for this lease)
-- returns {0, expires_ms} | {20} LEASE_LOST: taken back, re-granted, or completed
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return {S.LEASE_LOST} end
local token, _, rest = string.match(held, '^(%d+) (%d+) (.*)$')
if token ~= ARGV[2] then return {S.LEASE_LOST} end
if G.FENCING and string.match(rest, '^(%S+) ') ~= ARGV[4] then return {S.LEASE_LOST} end
local expires = NOW_MS() + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], token .. ' ' .. expires .. ' ' .. rest)
redis.call('ZADD', KEYS[2], expires, ARGV[1])
return {S.OK, expires}
