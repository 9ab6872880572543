-- init_epoch: create one (dataset, epoch)'s pool of shards to lease, once, in bounded chunks
-- (no call holds Redis for long at any epoch size). Chunk k holds the shards with ids
-- [offset, offset + count): the same for every caller, so concurrent callers and a caller
-- that died half-way cannot add a shard twice or miss one; the pool opens (field `swept`,
-- which acquire_shard waits for) when the last chunk is in. Later calls change nothing.
-- It also closes an earlier epoch of the dataset (the caller names it: the one before this,
-- less the epochs the dataset keeps whole) once that epoch is finished (every shard done) or
-- the job's epoch is past it: its per-shard keys are UNLINKed (freed off the main thread: O(1)
-- here at any size) and its meta HASH becomes the epoch's summary of constant size (num_shards,
-- created_ms, steals, done, closed_ms, by:<worker> and last:<worker>: bounded by the workers),
-- kept ARGV[4] seconds. Closing is idempotent.
-- KEYS[1] = epoch meta HASH   KEYS[2] = todo ZSET   KEYS[3] = done HASH
-- KEYS[4] = the job's epoch STRING
-- KEYS[5..10] = the epoch to close: meta HASH, todo ZSET, holders HASH, expiry ZSET, done HASH,
--               offsets HASH (absent: none to close)
-- ARGV[1] = number of shards
-- ARGV[2] = offset: the id of this chunk's first shard
-- ARGV[3] = the epoch to close ("" for none)   ARGV[4] = a closed epoch's summary TTL, seconds
-- ARGV[5..] = priority, shard id, ... (ids offset, offset + 1, ...; the priority orders
--             stealing: highest first)
-- returns {0, 1, total}: the pool is complete (it was, or this chunk completed it)
--       | {0, 0, loaded}: not complete; send the chunk starting at shard id `loaded`
--       | {22} EPOCH_MISMATCH: it exists with another shard count
if NKEYS >= 10 then
  local old = redis.call('HMGET', KEYS[5], 'num_shards', 'swept', 'closed_ms')
  if old[2] and not old[3] then
    local done = redis.call('HLEN', KEYS[9])
    local job_epoch = tonumber(redis.call('GET', KEYS[4]) or '-1')
    if done >= tonumber(old[1]) or job_epoch > tonumber(ARGV[3]) then
      for i = 6, 10 do redis.call('UNLINK', KEYS[i]) end
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      redis.call('HDEL', KEYS[5], 'swept', 'loaded', 'sweep_gen', 'sweep_cursor')
      redis.call('HSET', KEYS[5], 'done', done, 'closed_ms', now)
      redis.call('EXPIRE', KEYS[5], tonumber(ARGV[4]))
    end
  end
end
local meta = redis.call('HMGET', KEYS[1], 'num_shards', 'swept', 'loaded', 'closed_ms')
if meta[1] and meta[1] ~= ARGV[1] then return {S.EPOCH_MISMATCH} end
if meta[2] or meta[4] then return {S.OK, 1, tonumber(meta[1])} end
local loaded = tonumber(meta[3] or '0')
local total = tonumber(ARGV[1])
local offset = tonumber(ARGV[2])
-- a chunk another caller already added, or one beyond the next: say where to go on
if offset ~= loaded then return {S.OK, 0, loaded} end
local count = (NARGV - 4) / 2
-- unpack() is bounded by Lua's stack: add in pieces
local piece = 4000
for i = 5, NARGV, piece do
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
