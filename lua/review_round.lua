-- review_round: at an epoch boundary, decide once for every member of round g whether it
-- goes on, or ends so that workers that arrived late (live, waiting) join a bigger round.
-- The first member to ask decides and records it; the others read the same answer. It is
-- asked after the round's epoch barrier released: the round is marked synced ('synced' = g).
-- Bounded (uses: lib/rendezvous.lua): it drops the waiting entries older than the heartbeat
-- timeout (a waiter refreshes its entry, ms on Redis' clock, on each look while it waits: an
-- old one is a dead waiter's), then looks at the 256 least recently refreshed at most,
-- dropping the dead ones; a live one among them is enough to grow.
-- uses: lib/rendezvous.lua
-- KEYS[1] = rendezvous HASH   KEYS[2] = waiting ZSET   KEYS[3] = heartbeats ZSET
-- KEYS[4] = rendezvous events STREAM   KEYS[5] = membership events STREAM
-- KEYS[6] = generation STRING   KEYS[7] = expected SET of round g+1
-- ARGV[1] = g   ARGV[2] = the epoch just reached   ARGV[3] = max_workers
-- ARGV[4] = events stream cap   ARGV[5] = the job's heartbeat timeout, ms
-- returns {S.OK, 'keep'} | {S.OK, 'grow'}: round g+1 is open, join it
--       | {S.OK, 'moved'}: round g is over already (broken or superseded), join again
local R = KEYS[1]
local f = redis.call('HMGET', R, 'round', 'state', 'broken_round', 'decided_epoch', 'decision',
  'world_size')
-- the caller is in round g: a rendezvous with no round lost its hash (G.ANCHORS)
if G.ANCHORS and not f[1] and tonumber(ARGV[1]) > 0 then return LOST(R) end
if f[1] ~= ARGV[1] or f[2] ~= 'closed' or f[3] == ARGV[1] then return {S.OK, 'moved'} end
if f[4] == ARGV[2] then return {S.OK, f[5]} end
local now = NOW_MS()
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - tonumber(ARGV[5])))
local waiting = false
for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, SCAN_STEP - 1)) do
  if not redis.call('ZSCORE', KEYS[3], w) then redis.call('ZREM', KEYS[2], w)
  else waiting = true end
end
local decision = 'keep'
if waiting and tonumber(f[6]) < tonumber(ARGV[3]) then
  decision = 'grow'
  open_round({R = R, rv_events = KEYS[4], events = KEYS[5], gen = KEYS[6], expected = KEYS[7]},
    tonumber(ARGV[1]) + 1, 'growth', now, ARGV[4])
end
-- (the epoch barrier passed whole: every member of round g holds the state now, and carries
-- it into the next round: lib/rendezvous.lua)
redis.call('HSET', R, 'decided_epoch', ARGV[2], 'decision', decision, 'synced', ARGV[1])
return {S.OK, decision}
