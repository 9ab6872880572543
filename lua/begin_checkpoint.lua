-- begin_checkpoint: a participant announces that it is uploading its part of a checkpoint.
-- Refused: a checkpoint already committed, one not after the job's newest committed one (in
-- (run, epoch, step) order: the index sorts its members by bytes, every score 0), an aborted
-- one, one opened with another world size, a rank another worker holds. Otherwise the
-- checkpoint is opened (state "open") if it is new, and the rank is recorded as the
-- caller's, so waiters can tell a participant that failed before acking.
-- KEYS[1] = checkpoint HASH   KEYS[2] = committed checkpoints ZSET (the index)
-- ARGV[1] = the checkpoint's index member   ARGV[2] = run   ARGV[3] = epoch ("" for none)
-- ARGV[4] = step   ARGV[5] = world size   ARGV[6] = rank   ARGV[7] = worker id
-- ARGV[8] = time-to-live of the checkpoint's keys, ms
-- returns {0} | {40, newest committed member} STALE | {41, culprit, reason} ABORTED
--       | {42, world size, epoch} CONFLICT | {43, worker} RANK_TAKEN | {44} COMMITTED
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return {S.STEP_COMMITTED} end
if #redis.call('ZRANGEBYLEX', KEYS[2], '(' .. ARGV[1], '+', 'LIMIT', 0, 1) > 0 then
  return {S.STEP_NOT_FORWARD, redis.call('ZRANGE', KEYS[2], -1, -1)[1]}
end
local state = redis.call('HMGET', KEYS[1], 'state', 'world_size', 'epoch', 'culprit', 'reason')
if state[1] == 'aborted' then return {S.STEP_ABORTED, state[4] or '', state[5] or ''} end
if state[1] == 'committed' then return {S.STEP_COMMITTED} end
if state[1] and (state[2] ~= ARGV[5] or state[3] ~= ARGV[3]) then
  return {S.STEP_MISMATCH, state[2] or '', state[3] or ''}
end
local field = 'r:' .. ARGV[6]
local holder = redis.call('HGET', KEYS[1], field)
if holder and holder ~= ARGV[7] then return {S.RANK_NOT_HELD, holder} end
if not state[1] then
  local now = NOW_MS()
  redis.call('HSET', KEYS[1], 'state', 'open', 'world_size', ARGV[5], 'run', ARGV[2],
    'epoch', ARGV[3], 'step', ARGV[4], 'opened_ms', now)
end
redis.call('HSET', KEYS[1], field, ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return {S.OK}
