-- abort_checkpoint: a participant's upload failed (or its wait gave up): the step can never
-- commit. Mark it aborted (the first culprit and reason stay), wake every waiter at once,
-- and record the failed save. A committed step cannot be aborted, nor a committing one but
-- by its own leader (another participant cannot know whether metadata.json was written).
-- KEYS[1] = step HASH   KEYS[2] = wake LIST   KEYS[3] = save records STREAM
-- ARGV[1] = step   ARGV[2] = worker id (the culprit)   ARGV[3] = reason   ARGV[4] = rank
-- ARGV[5] = world size   ARGV[6] = time-to-live of the step's keys, ms
-- ARGV[7] = records cap (approximate)   ARGV[8] = bytes   ARGV[9] = seconds taken
-- returns {0} aborted (now or before) | {44} COMMITTED | {45, leader} COMMITTING
local state = redis.call('HMGET', KEYS[1], 'state', 'world_size', 'leader')
if state[1] == 'committed' then return {S.STEP_COMMITTED} end
if state[1] == 'committing' and state[3] ~= ARGV[2] then return {S.STEP_COMMITTING, state[3] or ''} end
if state[1] == 'aborted' then return {S.OK} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'state', 'aborted', 'culprit', ARGV[2], 'reason', ARGV[3],
  'aborted_ms', now)
if not state[2] then redis.call('HSET', KEYS[1], 'world_size', ARGV[5]) end
for _ = 1, tonumber(state[2] or ARGV[5]) do redis.call('RPUSH', KEYS[2], 'aborted') end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'step', ARGV[1], 'rank', ARGV[4],
  'worker', ARGV[2], 'bytes', ARGV[8], 'seconds', ARGV[9], 'mb_s', '0', 'outcome', 'aborted',
  'at_ms', now)
return {S.OK}
