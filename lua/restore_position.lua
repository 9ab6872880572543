-- restore_position: put one dataset's lease pool back to the data position a checkpoint
-- recorded, once per restore, in bounded chunks (no call holds Redis for long at any epoch
-- size). The epoch's pool is rebuilt: the shards the checkpoint's model trained on are done
-- (token 0: no lease can complete them again), the shards it trained part of keep their
-- offset (the next lease starts there) and are copied into the restored HASH, which nothing
-- changes after (every member's data position carries those offsets until the shards are
-- done, a worker that joins the epoch later without resuming too), every other shard is in
-- the pool (bit 0); later epochs' pools are deleted. The job's epoch is not this script's:
-- the members put it back first (coordination's restore_epoch.lua). Every member of the
-- restoring round sends the same chunks in order; the script applies only the next one, so
-- racing members and a member that died half-way neither double nor miss a shard. The pool
-- opens (meta `swept`, which acquire_shard waits for) and the mark is set with the last
-- chunk. Nobody leases meanwhile: the restoring round's members restore before they lease,
-- and workers that arrive later wait for the next round.
-- KEYS[1] = restores HASH (the mark, and the progress field `<mark field>:next`)
-- KEYS[2..8] = the epoch's meta HASH, taken STRING, holders HASH, expiry ZSET, done STRING,
--              offsets HASH, restored HASH
-- KEYS[9..] = the epoch's workers HASH and record segments, and every key of later epochs'
--             pools, deleted by chunk 0 (with KEYS[2..8])
-- ARGV[1] = the mark's field   ARGV[2] = the mark (the restoring round)
-- ARGV[3] = number of shards   ARGV[4] = this chunk's index k   ARGV[5] = number of chunks
-- ARGV[6] = n, then n done shard ids; then m, then m pairs: shard id, samples trained
-- (this chunk's part of each list). A restored done shard is done and taken in the bitmaps,
-- with token 0 and worker index 0 in its record (the record's zeros: nothing is written)
-- returns {S.OK, done, next, applied}: done = 1 when the restore is complete (it was, or this
--   chunk completed it); else 0 and `next`, the chunk to send next; applied = 1 when this
--   call applied its chunk
local field, mark = ARGV[1], ARGV[2]
local k, chunks = tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('HGET', KEYS[1], field) == mark then return {S.OK, 1, chunks, 0} end
local progress = field .. ':next'
local at = redis.call('HGET', KEYS[1], progress)
local nxt = nil
if at then
  local sep = string.find(at, ' ', 1, true)
  if string.sub(at, 1, sep - 1) == mark then nxt = tonumber(string.sub(at, sep + 1)) end
end
if nxt == nil then
  -- no restore of this mark under way: chunk 0 starts one (an older mark's is abandoned)
  if k ~= 0 then return {S.OK, 0, 0, 0} end
  for i = 2, NKEYS do redis.call('UNLINK', KEYS[i]) end  -- freed off the main thread
  -- the bitmaps at their size at once (as init_epoch makes them)
  local last = math.ceil(tonumber(ARGV[3]) / 8) - 1
  redis.call('SETRANGE', KEYS[3], last, '\0')
  redis.call('SETRANGE', KEYS[6], last, '\0')
  redis.call('HSET', KEYS[2], 'done', 0)  -- the meta stands with its bitmaps (acquire_shard)
  nxt = 0
end
-- a chunk another member applied, or one beyond the next: say where to go on
if k ~= nxt then return {S.OK, 0, nxt, 0} end
local i = 6
local n = tonumber(ARGV[i])
for j = i + 1, i + n do
  local shard = tonumber(ARGV[j])
  redis.call('SETBIT', KEYS[6], shard, 1)
  redis.call('SETBIT', KEYS[3], shard, 1)
end
if n > 0 then redis.call('HINCRBY', KEYS[2], 'done', n) end
i = i + n + 1
local m = tonumber(ARGV[i])
for j = i + 1, i + 2 * m, 2 do
  redis.call('HSET', KEYS[7], ARGV[j], ARGV[j + 1])
  redis.call('HSET', KEYS[8], ARGV[j], ARGV[j + 1])
end
-- both made: acquire_shard checks they still exist
if m > 0 then redis.call('HSET', KEYS[2], 'offsets', 1, 'restored', 1) end
if k + 1 < chunks then
  redis.call('HSET', KEYS[1], progress, mark .. ' ' .. (k + 1))
  return {S.OK, 0, k + 1, 1}
end
local now = NOW_MS()
redis.call('HSET', KEYS[2], 'num_shards', ARGV[3], 'created_ms', now, 'swept', '-1')
redis.call('HSETNX', KEYS[2], 'done', 0)
redis.call('HSET', KEYS[1], field, mark)
redis.call('HDEL', KEYS[1], progress)
return {S.OK, 1, chunks, 1}
