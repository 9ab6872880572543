-- begin_checkpoint: a participant announces that it is uploading its part of a step. Refused:
-- a step already committed, a step not after the job's newest committed step, an aborted
-- step, a step opened with another world size or epoch, a rank another worker holds.
-- Otherwise the step is opened (state "open") if it is new, and the rank is recorded as the
-- caller's, so waiters can tell a participant that failed before acking.
-- KEYS[1] = step HASH   KEYS[2] = committed steps ZSET
-- ARGV[1] = step   ARGV[2] = epoch ("" for none)   ARGV[3] = world size   ARGV[4] = rank
-- ARGV[5] = worker id   ARGV[6] = time-to-live of the step's keys, ms
-- returns {0} | {40, newest committed step} STALE | {41, culprit, reason} ABORTED
--       | {42, world size, epoch} CONFLICT | {43, worker} RANK_TAKEN | {44} COMMITTED
local step = tonumber(ARGV[1])
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return {S.STEP_COMMITTED} end
local newest = redis.call('ZRANGE', KEYS[2], 0, 0, 'REV')
if #newest > 0 and tonumber(newest[1]) >= step then return {S.STEP_NOT_FORWARD, newest[1]} end
local state = redis.call('HMGET', KEYS[1], 'state', 'world_size', 'epoch', 'culprit', 'reason')
if state[1] == 'aborted' then return {S.STEP_ABORTED, state[4] or '', state[5] or ''} end
if state[1] == 'committed' then return {S.STEP_COMMITTED} end
if state[1] and (state[2] ~= ARGV[3] or state[3] ~= ARGV[2]) then
  return {S.STEP_MISMATCH, state[2] or '', state[3] or ''}
end
local field = 'r:' .. ARGV[4]
local holder = redis.call('HGET', KEYS[1], field)
if holder and holder ~= ARGV[5] then return {S.RANK_NOT_HELD, holder} end
if not state[1] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[1], 'state', 'open', 'world_size', ARGV[3], 'epoch', ARGV[2],
    'opened_ms', now)
end
redis.call('HSET', KEYS[1], field, ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {S.OK}
