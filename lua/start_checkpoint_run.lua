-- start_checkpoint_run: a fresh rendezvous round (every member new: the whole job launched or
-- relaunched) starts the job's next run, once for the round: the first member to call it
-- decides, every other member of that round reads the same run. The run is the larger of
-- the caller's candidate (the newest committed checkpoint's run + 1, or 0 without one) and
-- the previous run + 1, so a run never repeats while Redis remembers it.
-- KEYS[1] = the job's run HASH (run, round, started_ms)
-- ARGV[1] = the fresh round's number   ARGV[2] = candidate run
-- returns {0, run}
local cur = redis.call('HMGET', KEYS[1], 'run', 'round')
if cur[2] == ARGV[1] then return {S.OK, tonumber(cur[1])} end
local run = tonumber(ARGV[2])
if cur[1] and tonumber(cur[1]) + 1 > run then run = tonumber(cur[1]) + 1 end
redis.call('HSET', KEYS[1], 'run', string.format('%d', run), 'round', ARGV[1],
  'started_ms', NOW_MS())
return {S.OK, run}
