-- abort_checkpoint: a participant's upload failed (or its wait gave up): the checkpoint can
-- never commit. Mark it aborted (the first culprit and reason stay), wake every waiter at
-- once, and record the failed save. A committed checkpoint cannot be aborted, nor a
-- committing one but by its own leader (another participant cannot know whether
-- metadata.json was written).
-- KEYS[1] = checkpoint HASH   KEYS[2] = wake LIST   KEYS[3] = save records STREAM
-- KEYS[4] = checkpoint totals HASH (aborted_steps, aborted_saves: +1 here; never reset)
-- ARGV[1] = run   ARGV[2] = epoch ("" for none)   ARGV[3] = step
-- ARGV[4] = worker id (the culprit)   ARGV[5] = reason   ARGV[6] = rank
-- ARGV[7] = world size   ARGV[8] = time-to-live of the checkpoint's keys, ms
-- ARGV[9] = records cap (approximate)   ARGV[10] = bytes   ARGV[11] = seconds taken
-- returns {0} aborted (now or before) | {44} COMMITTED | {45, leader} COMMITTING
local state = redis.call('HMGET', KEYS[1], 'state', 'world_size', 'leader')
if state[1] == 'committed' then return {S.STEP_COMMITTED} end
if state[1] == 'committing' and state[3] ~= ARGV[4] then return {S.STEP_COMMITTING, state[3] or ''} end
if state[1] == 'aborted' then return {S.OK} end
local now = NOW_MS()
redis.call('HSET', KEYS[1], 'state', 'aborted', 'culprit', ARGV[4], 'reason', ARGV[5],
  'aborted_ms', now)
redis.call('HINCRBY', KEYS[4], 'aborted_steps', 1)
redis.call('HINCRBY', KEYS[4], 'aborted_saves', 1)
if not state[2] then
  redis.call('HSET', KEYS[1], 'world_size', ARGV[7], 'run', ARGV[1], 'epoch', ARGV[2],
    'step', ARGV[3])
end
for _ = 1, tonumber(state[2] or ARGV[7]) do redis.call('RPUSH', KEYS[2], 'aborted') end
redis.call('PEXPIRE', KEYS[1], ARGV[8])
redis.call('PEXPIRE', KEYS[2], ARGV[8])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[9], '*', 'step', ARGV[3], 'epoch', ARGV[2],
  'run', ARGV[1], 'rank', ARGV[6], 'worker', ARGV[4], 'bytes', ARGV[10],
  'seconds', ARGV[11], 'mb_s', '0', 'outcome', 'aborted', 'at_ms', now)
return {S.OK}
