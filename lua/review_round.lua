-- review_round: at an epoch boundary, decide once for every member of round g whether it
-- goes on, or ends so that workers that arrived late (live, waiting) join a bigger round.
-- The first member to ask decides and records it; the others read the same answer.
-- KEYS[1] = rendezvous HASH   KEYS[2] = waiting ZSET   KEYS[3] = heartbeats ZSET
-- KEYS[4] = rendezvous events STREAM
-- ARGV[1] = g   ARGV[2] = the epoch just reached   ARGV[3] = max_workers
-- ARGV[4] = events stream cap
-- returns {S.OK, 'keep'} | {S.OK, 'grow'}: round g+1 is open, join it
--       | {S.OK, 'moved'}: round g is over already (broken or superseded), join again
local R = KEYS[1]
local f = redis.call('HMGET', R, 'round', 'state', 'broken_round', 'decided_epoch', 'decision',
  'world_size')
if f[1] ~= ARGV[1] or f[2] ~= 'closed' or f[3] == ARGV[1] then return {S.OK, 'moved'} end
if f[4] == ARGV[2] then return {S.OK, f[5]} end
for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if not redis.call('ZSCORE', KEYS[3], w) then redis.call('ZREM', KEYS[2], w) end
end
local decision = 'keep'
if redis.call('ZCARD', KEYS[2]) > 0 and tonumber(f[6]) < tonumber(ARGV[3]) then
  decision = 'grow'
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local n = tonumber(ARGV[1]) + 1
  redis.call('HSET', R, 'round', n, 'state', 'joining', 'opened_ms', now, 'deadline_ms', 0,
    'world_size', 0)
  redis.call('HINCRBY', R, 'restarts_growth', 1)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'type', 'open', 'round', n,
    'reason', 'growth', 'ms', now)
end
redis.call('HSET', R, 'decided_epoch', ARGV[2], 'decision', decision)
return {S.OK, decision}
