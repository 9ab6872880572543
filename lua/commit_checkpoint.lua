-- commit_checkpoint: the leader wrote metadata.json; mark the checkpoint committed, add it to
-- the job's index (its member with score 0: the index sorts by member), and wake every
-- waiter of the checkpoint, and record where it lives. Repeating a commit is harmless.
-- KEYS[1] = checkpoint HASH   KEYS[2] = acks HASH   KEYS[3] = wake LIST
-- KEYS[4] = committed checkpoints ZSET   KEYS[5] = committed metadata HASH
-- KEYS[6] = committed locations HASH (index member -> where it lives in storage)
-- ARGV[1] = the checkpoint's index member   ARGV[2] = worker id
-- ARGV[3] = its metadata.json   ARGV[4] = "1" to take over from a leader that did not
-- finish, else "0"   ARGV[5] = time-to-live of the finished checkpoint's keys, ms
-- ARGV[6] = its location (s3://bucket/prefix/<job>/checkpoints/<label>, file:///...)
-- returns {0, committed_ms} | {41, culprit, reason} ABORTED | {45, leader} NOT_LEADER
local state = redis.call('HMGET', KEYS[1], 'state', 'world_size', 'leader', 'culprit', 'reason',
  'committed_ms')
if state[1] == 'committed' then return {S.OK, tonumber(state[6])} end
if state[1] == 'aborted' then return {S.STEP_ABORTED, state[4] or '', state[5] or ''} end
if state[1] ~= 'committing' or (state[3] ~= ARGV[2] and ARGV[4] ~= '1') then
  return {S.STEP_COMMITTING, state[3] or ''}
end
local now = NOW_MS()
redis.call('HSET', KEYS[1], 'state', 'committed', 'committed_ms', now)
redis.call('ZADD', KEYS[4], 0, ARGV[1])
redis.call('HSET', KEYS[5], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[6], ARGV[1], ARGV[6])
for _ = 1, tonumber(state[2]) do redis.call('RPUSH', KEYS[3], 'committed') end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return {S.OK, now}
