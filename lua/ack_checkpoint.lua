-- ack_checkpoint: a participant's parts are uploaded: record its files (sizes, checksums) and
-- its save record. The ack that completes the checkpoint (world size acks in) makes its
-- sender the one leader: the state moves to "committing" and the leader gets every rank's
-- files, to write metadata.json. A checkpoint that is no longer after the newest committed
-- one (index members sort in (run, epoch, step) order) can never commit: it is aborted here,
-- and its waiters are woken at once. The same ack sent again (its reply was lost to a Redis
-- restart or failover) is recorded once: its save record and totals are not counted twice,
-- and one that finds the checkpoint committed since is answered as an ack (the caller's wait
-- then finds it committed).
-- KEYS[1] = checkpoint HASH   KEYS[2] = acks HASH   KEYS[3] = wake LIST
-- KEYS[4] = committed checkpoints ZSET   KEYS[5] = save records STREAM
-- KEYS[6] = checkpoint totals HASH (saves, saved_bytes, save_ms, aborted_steps: never reset)
-- ARGV[1] = the checkpoint's index member   ARGV[2] = run   ARGV[3] = epoch ("" for none)
-- ARGV[4] = step   ARGV[5] = rank   ARGV[6] = worker id   ARGV[7] = the rank's files, JSON
-- ARGV[8] = time-to-live of the checkpoint's keys, ms   ARGV[9] = records cap (approximate)
-- ARGV[10] = bytes   ARGV[11] = seconds taken   ARGV[12] = MB/s
-- returns {0, 1, acked_ms, acked_clock, rank, files, rank, files, ...}: the caller leads the
--       commit (acked_clock: the job's clock at the last ack, CLOCK of the era prelude; the
--       checkpoint's metadata records it, so a resume can tell Redis went back)
--       | {0, 0}: acked, wait for the others (or the commit) | {44} COMMITTED
--       | {40, newest committed member} STALE | {41, culprit, reason} ABORTED
--       | {43, holder}: the rank is not the caller's (another worker's, or it expired)
local state = redis.call('HMGET', KEYS[1], 'state', 'world_size', 'leader', 'culprit', 'reason')
local again = redis.call('HGET', KEYS[2], ARGV[5]) == ARGV[7]
if state[1] == 'committed' then
  if again then return {S.OK, 0} end
  return {S.STEP_COMMITTED}
end
if state[1] == 'aborted' then return {S.STEP_ABORTED, state[4] or '', state[5] or ''} end
local holder = redis.call('HGET', KEYS[1], 'r:' .. ARGV[5])
if holder ~= ARGV[6] then return {S.RANK_NOT_HELD, holder or ''} end
if state[1] == 'committing' then
  if state[3] == ARGV[6] then
    local acked = redis.call('HMGET', KEYS[1], 'acked_ms', 'acked_clock')
    local reply = {S.OK, 1, tonumber(acked[1]), tonumber(acked[2] or '0')}
    for _, v in ipairs(redis.call('HGETALL', KEYS[2])) do reply[#reply + 1] = v end
    return reply
  end
  return {S.OK, 0}
end
local now = NOW_MS()
if #redis.call('ZRANGEBYLEX', KEYS[4], '[' .. ARGV[1], '+', 'LIMIT', 0, 1) > 0 then
  local newest = redis.call('ZRANGE', KEYS[4], -1, -1)[1]
  local reason = 'superseded: checkpoint ' .. newest .. ' committed first'
  redis.call('HSET', KEYS[1], 'state', 'aborted', 'culprit', ARGV[6], 'reason', reason,
    'aborted_ms', now)
  redis.call('HINCRBY', KEYS[6], 'aborted_steps', 1)
  for _ = 1, tonumber(state[2]) do redis.call('RPUSH', KEYS[3], 'aborted') end
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
  return {S.STEP_NOT_FORWARD, newest}
end
if not again then
  redis.call('HSET', KEYS[2], ARGV[5], ARGV[7])
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[9], '*', 'step', ARGV[4], 'epoch', ARGV[3],
    'run', ARGV[2], 'rank', ARGV[5], 'worker', ARGV[6], 'bytes', ARGV[10],
    'seconds', ARGV[11], 'mb_s', ARGV[12], 'outcome', 'uploaded', 'at_ms', now)
  redis.call('HINCRBY', KEYS[6], 'saves', 1)
  redis.call('HINCRBY', KEYS[6], 'saved_bytes', ARGV[10])
  redis.call('HINCRBY', KEYS[6], 'save_ms', math.floor(tonumber(ARGV[11]) * 1000 + 0.5))
end
redis.call('PEXPIRE', KEYS[2], ARGV[8])
redis.call('PEXPIRE', KEYS[1], ARGV[8])
-- (G.COMMIT: the all-ranks check; off only for the fault checker's proof)
if G.COMMIT and redis.call('HLEN', KEYS[2]) < tonumber(state[2]) then return {S.OK, 0} end
redis.call('HSET', KEYS[1], 'state', 'committing', 'leader', ARGV[6], 'acked_ms', now,
  'acked_clock', CLOCK)
local reply = {S.OK, 1, now, CLOCK}
for _, v in ipairs(redis.call('HGETALL', KEYS[2])) do reply[#reply + 1] = v end
return reply
