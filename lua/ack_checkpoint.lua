-- ack_checkpoint: a participant's parts are uploaded: record its files (sizes, checksums) and
-- its save record. The ack that completes the step (world size acks in) makes its sender
-- the one leader: the state moves to "committing" and the leader gets every rank's files,
-- to write metadata.json. A step that is no longer after the newest committed one can never
-- commit: it is aborted here, and its waiters are woken at once.
-- KEYS[1] = step HASH   KEYS[2] = acks HASH   KEYS[3] = wake LIST   KEYS[4] = committed ZSET
-- KEYS[5] = save records STREAM
-- ARGV[1] = step   ARGV[2] = rank   ARGV[3] = worker id   ARGV[4] = the rank's files, JSON
-- ARGV[5] = time-to-live of the step's keys, ms   ARGV[6] = records cap (approximate)
-- ARGV[7] = bytes   ARGV[8] = seconds taken   ARGV[9] = MB/s
-- returns {0, 1, acked_ms, rank, files, rank, files, ...}: the caller leads the commit
--       | {0, 0}: acked, wait for the others (or the commit) | {44} COMMITTED
--       | {40, newest committed step} STALE | {41, culprit, reason} ABORTED
--       | {43, holder}: the rank is not the caller's (another worker's, or the step expired)
local state = redis.call('HMGET', KEYS[1], 'state', 'world_size', 'leader', 'culprit', 'reason')
if state[1] == 'committed' then return {S.STEP_COMMITTED} end
if state[1] == 'aborted' then return {S.STEP_ABORTED, state[4] or '', state[5] or ''} end
local holder = redis.call('HGET', KEYS[1], 'r:' .. ARGV[2])
if holder ~= ARGV[3] then return {S.RANK_NOT_HELD, holder or ''} end
if state[1] == 'committing' then
  if state[3] == ARGV[3] then
    local acked_ms = redis.call('HGET', KEYS[1], 'acked_ms')
    local reply = {S.OK, 1, tonumber(acked_ms)}
    for _, v in ipairs(redis.call('HGETALL', KEYS[2])) do reply[#reply + 1] = v end
    return reply
  end
  return {S.OK, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local newest = redis.call('ZRANGE', KEYS[4], 0, 0, 'REV')
if #newest > 0 and tonumber(newest[1]) >= tonumber(ARGV[1]) then
  local reason = 'superseded: step ' .. newest[1] .. ' committed first'
  redis.call('HSET', KEYS[1], 'state', 'aborted', 'culprit', ARGV[3], 'reason', reason,
    'aborted_ms', now)
  for _ = 1, tonumber(state[2]) do redis.call('RPUSH', KEYS[3], 'aborted') end
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
  return {S.STEP_NOT_FORWARD, newest[1]}
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*', 'step', ARGV[1], 'rank', ARGV[2],
  'worker', ARGV[3], 'bytes', ARGV[7], 'seconds', ARGV[8], 'mb_s', ARGV[9],
  'outcome', 'uploaded', 'at_ms', now)
if redis.call('HLEN', KEYS[2]) < tonumber(state[2]) then return {S.OK, 0} end
redis.call('HSET', KEYS[1], 'state', 'committing', 'leader', ARGV[3], 'acked_ms', now)
local reply = {S.OK, 1, now}
for _, v in ipairs(redis.call('HGETALL', KEYS[2])) do reply[#reply + 1] = v end
return reply
