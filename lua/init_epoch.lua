-- init_epoch: create one (dataset, epoch)'s pool of shards to lease, once: O(1) at any epoch
-- size. The pool is the shards whose bit in the taken bitmap is 0, and a missing bitmap has
-- every bit 0: the meta opens it (field `swept`, which acquire_shard waits for); the taken
-- and done bitmaps are created at their size (num_shards / 8 bytes each: 1.25 MB at 10^7
-- shards, one allocation). Later calls change nothing.
-- It also closes an earlier epoch of the dataset (the caller names it: the one before this,
-- less the epochs the dataset keeps whole) once that epoch is finished (every shard done) or
-- the job's epoch is past it: its per-shard keys are UNLINKed (bitmaps and record segments
-- of at most 768 KiB each, the holders and offsets freed off the main thread: bounded here
-- at any size) and its meta HASH becomes the epoch's summary (num_shards, created_ms,
-- steals, done, closed_ms, and per worker by:/last:, bounded by the workers), kept
-- ARGV[3] seconds. Closing is idempotent.
-- A pool is never opened again over part of one (G.ANCHORS): an open meta whose bitmaps are
-- gone, or bitmaps whose meta is gone, answer S.STATE_LOST naming the key (LOST, status.py).
-- KEYS[1] = epoch meta HASH   KEYS[2] = the job's epoch STRING
-- KEYS[3] = taken STRING (bitmap)   KEYS[4] = done STRING (bitmap)
-- KEYS[5..] = the epoch to close (absent: none): meta HASH, taken STRING, holders HASH,
--             expiry ZSET, done STRING, offsets HASH, restored HASH, workers HASH, then its
--             record segments (STRINGs)
-- ARGV[1] = number of shards
-- ARGV[2] = the epoch to close ("" for none)   ARGV[3] = a closed epoch's summary TTL, seconds
-- ARGV[4] = seconds to live of the segments of a closed epoch this call does not UNLINK
-- returns {0, 1, total, closed}: the pool is open (it was, or this call opened it); closed = 1
--         when this call closed the epoch (the caller UNLINKs its segments past the 8th)
--       | {S.EPOCH_MISMATCH}: it exists with another shard count
--       | {S.STATE_LOST, era marked lost}: a key of the epoch's structure is gone
local UNLINK_NOW = 8
local closed = 0
if NKEYS >= 12 then
  local old = redis.call('HMGET', KEYS[5], 'num_shards', 'swept', 'closed_ms', 'done')
  if old[2] and not old[3] then
    local done = tonumber(old[4] or '0')
    local job_epoch = tonumber(redis.call('GET', KEYS[2]) or '-1')
    if done >= tonumber(old[1]) or job_epoch > tonumber(ARGV[2]) then
      -- at most UNLINK_NOW record segments here (freeing 768 KiB strings takes up to 0.1 ms
      -- each); the caller UNLINKs the rest in steps, or they expire in ARGV[4] seconds
      for i = 6, NKEYS do
        if i <= 12 + UNLINK_NOW then redis.call('UNLINK', KEYS[i])
        else redis.call('EXPIRE', KEYS[i], tonumber(ARGV[4])) end
      end
      local now = NOW_MS()
      redis.call('HDEL', KEYS[5], 'swept', 'cursor', 'sweep_gen', 'sweep_cursor', 'offsets',
        'restored', 'indexed')
      for k = 0, NKEYS - 13 do  -- KEYS[13..]: every record segment of the epoch
        redis.call('HDEL', KEYS[5], 'seg:' .. k)  -- which were made (acquire_shard)
      end
      redis.call('HSET', KEYS[5], 'done', done, 'closed_ms', now)
      redis.call('EXPIRE', KEYS[5], tonumber(ARGV[3]))
      closed = 1
    end
  end
end
local meta = redis.call('HMGET', KEYS[1], 'num_shards', 'swept', 'closed_ms')
if meta[1] and meta[1] ~= ARGV[1] then return {S.EPOCH_MISMATCH} end
if G.ANCHORS and not meta[3] then
  if meta[2] and redis.call('EXISTS', KEYS[3], KEYS[4]) < 2 then
    if redis.call('EXISTS', KEYS[3]) == 0 then return LOST(KEYS[3]) end
    return LOST(KEYS[4])
  end
  if not meta[2] and redis.call('EXISTS', KEYS[1]) == 0
      and redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then
    return LOST(KEYS[1])
  end
end
if meta[2] or meta[3] then return {S.OK, 1, tonumber(meta[1]), closed} end
local now = NOW_MS()
redis.call('HSET', KEYS[1], 'num_shards', ARGV[1], 'created_ms', now, 'swept', '-1')
redis.call('HSETNX', KEYS[1], 'done', 0)
-- the bitmaps at their size at once, zeros (a string grown by SETBITs past its end is given
-- up to twice the room, or 1 MB more)
local bytes = math.ceil(tonumber(ARGV[1]) / 8)
for i = 3, 4 do
  if redis.call('EXISTS', KEYS[i]) == 0 then redis.call('SETRANGE', KEYS[i], bytes - 1, '\0') end
end
return {S.OK, 1, tonumber(ARGV[1]), closed}
