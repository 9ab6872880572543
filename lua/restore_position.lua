-- restore_position: put one dataset's lease pool back to the data position a checkpoint
-- recorded, once per restore (the first member of the restoring round to call it does it;
-- the others find the mark and change nothing). The epoch's pool is rebuilt: the shards the
-- checkpoint's model trained on are done (token 0: no lease can complete them again), the
-- shards it trained part of keep their offset (the next lease starts there), every other
-- shard goes back to the pool; later epochs' pools are deleted and the job's epoch is set.
-- KEYS[1] = rendezvous HASH (the mark)   KEYS[2] = the job's epoch STRING
-- KEYS[3..8] = the epoch's meta HASH, todo ZSET, holders HASH, expiry ZSET, done HASH,
--              offsets HASH
-- KEYS[9..] = keys of later epochs' pools, deleted
-- ARGV[1] = the mark's field   ARGV[2] = the mark (the restoring round)   ARGV[3] = epoch
-- ARGV[4] = number of shards   ARGV[5] = n, then n done shard ids
-- then m, then m pairs: shard id, samples already trained
-- then the rest: priority, shard id pairs for every shard not done (the pool)
-- returns {S.OK, 1} restored now | {S.OK, 0} this restore was done already
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return {S.OK, 0} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
for i = 3, NKEYS do redis.call('DEL', KEYS[i]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local i = 5
local n = tonumber(ARGV[i])
for j = i + 1, i + n do redis.call('HSET', KEYS[7], ARGV[j], '0 restored') end
i = i + n + 1
local m = tonumber(ARGV[i])
for j = i + 1, i + 2 * m, 2 do redis.call('HSET', KEYS[8], ARGV[j], ARGV[j + 1]) end
i = i + 2 * m + 1
-- unpack() is bounded by Lua's stack: add in chunks
local chunk = 4000
for j = i, NARGV, chunk do
  local last = math.min(j + chunk - 1, NARGV)
  redis.call('ZADD', KEYS[4], unpack(ARGV, j, last))
end
redis.call('HSET', KEYS[3], 'num_shards', ARGV[4], 'loaded', ARGV[4], 'created_ms', now, 'swept', '-1')
return {S.OK, 1}
