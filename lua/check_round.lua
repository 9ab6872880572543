-- check_round: is round g still whole? It is over when a newer round opened (superseded),
-- when it was marked broken, or when one of its members is no longer alive (heartbeat gone,
-- or a newer registration of its id): then it is marked broken here, once, for everyone.
-- The last broken round's culprit stays in the hash (broken_round, broken, reason).
-- Run off the hot path: by a member's heartbeat thread when the membership generation moves.
-- Bounded at any size (uses: lib/rendezvous.lua): it reads the membership events since the
-- round's cursor, at most 500 a call, plus one HSCAN step of the members after events were
-- trimmed unread; 'more' = 1 says there is more to read (call again).
-- uses: lib/rendezvous.lua
-- KEYS[1] = rendezvous HASH   KEYS[2] = ranks HASH of round g   KEYS[3] = heartbeats ZSET
-- KEYS[4] = status HASH       KEYS[5] = incarnation HASH        KEYS[6] = rendezvous events STREAM
-- KEYS[7] = membership events STREAM
-- ARGV[1] = g   ARGV[2] = events stream cap
-- returns {S.OK, more} | {S.ROUND_BROKEN, culprit ('' if superseded), reason}
local R = KEYS[1]
local f = redis.call('HMGET', R, 'round', 'state', 'broken_round', 'broken', 'reason')
-- the caller is in round g: a rendezvous with no round lost its hash (G.ANCHORS)
if G.ANCHORS and not f[1] and tonumber(ARGV[1]) > 0 then return LOST(R) end
if f[3] == ARGV[1] then return {S.ROUND_BROKEN, f[4], f[5]} end
if f[1] ~= ARGV[1] or f[2] ~= 'closed' then return {S.ROUND_BROKEN, '', 'superseded'} end
local k = {R = R, ranks = KEYS[2], hb = KEYS[3], status = KEYS[4], incs = KEYS[5],
  events = KEYS[7]}
local member, more = members_gone(k, false)
if not member then
  if more then return {S.OK, 1} end
  return {S.OK, 0}
end
local why = why_gone(k, member)
redis.call('HSET', R, 'broken_round', ARGV[1], 'broken', member, 'reason', why)
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[2], '*', 'type', 'broken', 'round', ARGV[1],
  'worker', member, 'reason', why, 'ms', NOW_MS())
return {S.ROUND_BROKEN, member, why}
