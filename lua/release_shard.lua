-- release_shard: give a leased shard back to the pool without completing it, optionally
-- saying how much of it the caller took (the next grant starts there: a lockstep rank keeps
-- the part of a shard its quota needs and hands the rest back).
-- KEYS[1] = holders HASH   KEYS[2] = expiry ZSET   KEYS[3] = taken STRING (bitmap)
-- KEYS[4] = offsets HASH
-- ARGV[1] = shard id   ARGV[2] = fencing token   ARGV[3] = new offset (samples taken), or ""
-- returns {0} | {20} LEASE_LOST: the caller no longer holds it
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return {S.LEASE_LOST} end
local token = string.match(held, '^(%d+) ')
if token ~= ARGV[2] then return {S.LEASE_LOST} end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[4], ARGV[1], ARGV[3]) end
redis.call('SETBIT', KEYS[3], tonumber(ARGV[1]), 0)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return {S.OK}
