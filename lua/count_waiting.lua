-- count_waiting: how many workers wait for the next round and are alive. A waiting worker's
-- score in the waiting ZSET is its last look at the rendezvous (ms, Redis' clock): its join
-- loop sets it on every look, at least once per heartbeat_timeout / 4, while it waits. An
-- entry older than the heartbeat timeout is a waiter that died (SIGKILLed, its host lost): it
-- is not counted, so the members do not restart for a node that never comes. Read only; the
-- next round's opening scan (or review_round) drops such entries. O(log N).
-- KEYS[1] = rendezvous HASH   KEYS[2] = waiting ZSET
-- ARGV[1] = the job's heartbeat timeout, ms
-- returns {S.OK, live waiting, round (or false), state (or false), world_size (or false)}
local now = NOW_MS()
local live = redis.call('ZCOUNT', KEYS[2], now - tonumber(ARGV[1]), '+inf')
local f = redis.call('HMGET', KEYS[1], 'round', 'state', 'world_size')
return {S.OK, live, f[1], f[2], f[3]}
