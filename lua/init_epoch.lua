-- init_epoch: create one (dataset, epoch)'s pool of shards to lease, once, in bounded chunks
-- (no call holds Redis for long at any epoch size). Chunk k holds the shards with ids
-- [offset, offset + count): the same for every caller, so concurrent callers and a caller
-- that died half-way cannot add a shard twice or miss one; the pool opens (field `swept`,
-- which acquire_shard waits for) when the last chunk is in. Later calls change nothing.
-- KEYS[1] = epoch meta HASH   KEYS[2] = todo ZSET   KEYS[3] = done HASH
-- ARGV[1] = number of shards
-- ARGV[2] = offset: the id of this chunk's first shard
-- ARGV[3..] = priority, shard id, ... (ids offset, offset + 1, ...; the priority orders
--             stealing: highest first)
-- returns {0, 1, total}: the pool is complete (it was, or this chunk completed it)
--       | {0, 0, loaded}: not complete; send the chunk starting at shard id `loaded`
--       | {22} EPOCH_MISMATCH: it exists with another shard count
local meta = redis.call('HMGET', KEYS[1], 'num_shards', 'swept', 'loaded')
if meta[1] and meta[1] ~= ARGV[1] then return {S.EPOCH_MISMATCH} end
if meta[2] then return {S.OK, 1, tonumber(meta[1])} end
local loaded = tonumber(meta[3] or '0')
local total = tonumber(ARGV[1])
local offset = tonumber(ARGV[2])
-- a chunk another caller already added, or one beyond the next: say where to go on
if offset ~= loaded then return {S.OK, 0, loaded} end
local count = (NARGV - 2) / 2
-- unpack() is bounded by Lua's stack: add in pieces
local piece = 4000
for i = 3, NARGV, piece do
  local last = math.min(i + piece - 1, NARGV)
  redis.call('ZADD', KEYS[2], unpack(ARGV, i, last))
end
loaded = loaded + count
if loaded < total then
  redis.call('HSET', KEYS[1], 'num_shards', ARGV[1], 'loaded', loaded)
  return {S.OK, 0, loaded}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'num_shards', ARGV[1], 'loaded', loaded, 'created_ms', now,
  'swept', '-1')
return {S.OK, 1, loaded}
