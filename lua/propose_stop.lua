-- propose_stop: a preempted rank proposes the step at which the round's members stop and
-- save together; the first proposal wins, later ones read it (preemption.py).
-- KEYS[1] = the round's stop STRING (keys.preempt_stop): the agreed step
-- ARGV[1] = the proposed step   ARGV[2] = milliseconds the record lives
-- returns {0, agreed step}
local agreed = redis.call('GET', KEYS[1])
if agreed then return {S.OK, tonumber(agreed)} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {S.OK, tonumber(ARGV[1])}
