-- complete_shard: record a shard as done, exactly once, for the holder of its current lease.
-- A stale token (the lease was taken back or re-granted) is refused, so a paused worker
-- cannot record a shard another worker now owns. Repeating a successful completion with
-- the same token (a retry after a network error) succeeds without recording twice.
-- KEYS[1] = holders HASH   KEYS[2] = expiry ZSET   KEYS[3] = done HASH
-- ARGV[1] = shard id   ARGV[2] = fencing token   ARGV[3] = worker id
-- returns {0, 1} recorded now | {0, 0} already recorded with this token | {20} LEASE_LOST
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held or string.match(held, '^(%d+) ') ~= ARGV[2] then
  local done = redis.call('HGET', KEYS[3], ARGV[1])
  if done and string.match(done, '^(%d+) ') == ARGV[2] then return {0, 0} end
  return {20}
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return {0, 1}
