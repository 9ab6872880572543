-- init_epoch: create one (dataset, epoch)'s pool of shards to lease, once. Later calls
-- (any worker, any restart) find it and change nothing, so progress survives restarts.
-- KEYS[1] = epoch meta HASH   KEYS[2] = todo ZSET   KEYS[3] = done HASH
-- ARGV[1] = number of shards
-- ARGV[2..] = priority, shard id, priority, shard id, ... (every shard of the epoch;
--             the priority orders stealing: highest first)
-- returns {0, 1} created | {0, 0} existed | {22} EPOCH_MISMATCH: it exists with another shard count
local n = redis.call('HGET', KEYS[1], 'num_shards')
if n then
  if n ~= ARGV[1] then return {S.EPOCH_MISMATCH} end
  return {S.OK, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- unpack() is bounded by Lua's stack: add in chunks
local chunk = 4000
for i = 2, #ARGV, chunk do
  local last = math.min(i + chunk - 1, #ARGV)
  redis.call('ZADD', KEYS[2], unpack(ARGV, i, last))
end
redis.call('HSET', KEYS[1], 'num_shards', ARGV[1], 'created_ms', now, 'swept', '-1')
return {S.OK, 1}
