-- release_shard: give a leased shard back to the pool without completing it, optionally
-- saying how much of it the caller took (the next grant starts there: a lockstep rank keeps
-- the part of a shard its quota needs and hands the rest back). The samples the caller took
-- (ARGV[4]: the new offset less its lease's start) count in the dataset's lifetime totals
-- (samples, w:<holder>), as a completion's do.
-- KEYS[1] = holders HASH   KEYS[2] = expiry ZSET   KEYS[3] = taken STRING (bitmap)
-- KEYS[4] = offsets HASH   KEYS[5] = the dataset's lease totals HASH
-- KEYS[6] = epoch meta HASH (`offsets`: set once the offsets exist, acquire_shard checks
--           they still do)
-- ARGV[1] = shard id   ARGV[2] = fencing token   ARGV[3] = new offset (samples taken), or ""
-- ARGV[4] = samples of the shard the caller took with this lease ("" or 0: none)
-- ARGV[5] = the grant id (acquire_shard's ARGV[8] for this lease): the release names the
--           grant it ends, so a token number issued again after a rollback is not the caller's
-- returns {0} | {20} LEASE_LOST: the caller no longer holds it
--       | {S.STATE_LOST, era marked lost}: handing back part-way, the epoch's meta is gone
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return {S.LEASE_LOST} end
local token, grant, holder = string.match(held, '^(%d+) %d+ (%S+) (.*)$')
if token ~= ARGV[2] or (G.FENCING and grant ~= ARGV[5]) then return {S.LEASE_LOST} end
if ARGV[3] ~= '' then
  -- the meta gone: flagging it would make a meta of one field (acquire_shard: lost)
  if G.ANCHORS and redis.call('EXISTS', KEYS[6]) == 0 then return LOST(KEYS[6]) end
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
  redis.call('HSET', KEYS[6], 'offsets', 1)
  local samples = tonumber(ARGV[4]) or 0
  if samples > 0 then
    redis.call('HINCRBY', KEYS[5], 'samples', samples)
    redis.call('HINCRBY', KEYS[5], 'w:' .. holder, samples)
  end
end
redis.call('SETBIT', KEYS[3], tonumber(ARGV[1]), 0)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return {S.OK}
