-- check_checkpoint: a waiter's periodic look at a step it acked. An open step whose rank
-- holder is a registered worker that is no longer live (declared failed, or left) before
-- acking is aborted at once, naming it; so is an open step whose waiter timed out.
-- KEYS[1] = step HASH   KEYS[2] = acks HASH   KEYS[3] = wake LIST
-- KEYS[4] = worker heartbeats ZSET   KEYS[5] = worker status HASH
-- ARGV[1] = "1" if the caller's wait timed out, else "0"   ARGV[2] = caller's worker id
-- ARGV[3] = time-to-live of the step's keys, ms
-- returns {0, state, leader or culprit, reason}: state is open, committing, committed,
--         aborted, or missing (the step's keys expired)
local state = redis.call('HMGET', KEYS[1], 'state', 'world_size', 'leader', 'culprit', 'reason')
if not state[1] then return {S.OK, 'missing', '', ''} end
if state[1] == 'aborted' then return {S.OK, 'aborted', state[4] or '', state[5] or ''} end
if state[1] ~= 'open' then return {S.OK, state[1], state[3] or '', ''} end
local culprit, reason
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local rank = string.match(fields[i], '^r:(%d+)$')
  local worker = fields[i + 1]
  if rank and redis.call('HEXISTS', KEYS[2], rank) == 0
      and redis.call('HEXISTS', KEYS[5], worker) == 1
      and not redis.call('ZSCORE', KEYS[4], worker) then
    culprit = worker
    reason = 'worker ' .. worker .. ' (rank ' .. rank .. ') is no longer live; it never acked'
    break
  end
end
if not culprit and ARGV[1] == '1' then
  culprit = ARGV[2]
  reason = 'timed out waiting for ' .. (tonumber(state[2]) - redis.call('HLEN', KEYS[2]))
    .. ' of ' .. state[2] .. ' acks'
end
if not culprit then return {S.OK, 'open', '', ''} end
local now = NOW_MS()
redis.call('HSET', KEYS[1], 'state', 'aborted', 'culprit', culprit, 'reason', reason,
  'aborted_ms', now)
for _ = 1, tonumber(state[2]) do redis.call('RPUSH', KEYS[3], 'aborted') end
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return {S.OK, 'aborted', culprit, reason}
