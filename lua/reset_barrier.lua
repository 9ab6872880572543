-- reset_barrier: move a broken barrier on to a fresh generation, so the survivors of a
-- failure can meet again (with a new expected). Idempotent: every survivor may call it
-- with the generation that broke; only the first call moves the barrier.
-- KEYS[1] = barrier state HASH    KEYS[2] = arrived SET
-- ARGV[1] = the broken generation, or "" for the current one   ARGV[2] = key TTL, ms
-- returns {0, generation, what}: the generation now current, and what happened:
--   "reset" (moved on) | "moved" (already past ARGV[1]) | "idle" (nobody arrived yet)
--   | "open" (it has waiters: break it with check_barrier's abort first)
local cur = tonumber(redis.call('HGET', KEYS[1], 'gen'))
if not cur then return {S.OK, 1, 'idle'} end
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= cur then return {S.OK, cur, 'moved'} end
if redis.call('HEXISTS', KEYS[1], 'r:' .. cur) == 1 then
  redis.call('HSET', KEYS[1], 'gen', cur + 1)
  redis.call('HDEL', KEYS[1], 'expected', 'first_us', 'ev', 'broken')
  redis.call('UNLINK', KEYS[2])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  return {S.OK, cur + 1, 'reset'}
end
if redis.call('HEXISTS', KEYS[1], 'expected') == 1 then return {S.OK, cur, 'open'} end
return {S.OK, cur, 'idle'}
