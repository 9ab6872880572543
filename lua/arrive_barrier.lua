-- arrive_barrier: one worker arrives at the current generation of a named barrier. The
-- arrival that completes the generation releases it in the same call: it records the
-- outcome, moves the barrier to the next generation, pushes one release token per arrival
-- to the generation's release list (BLPOP waiters) and adds one entry to the wake stream
-- (XREAD waiters). A retried arrival (same ticket) is counted once: it is answered from
-- the generation it was counted in, even if that generation has since been released.
-- The release usually runs after the server idled while everyone waited, so every call on
-- its path counts: the state is read with one HMGET, and the keys' TTLs are set when a
-- generation opens (and extended by a waiter whose timeout needs more), not per arrival.
-- KEYS[1] = barrier state HASH    KEYS[2] = arrived SET       KEYS[3] = tickets HASH
-- KEYS[4] = release LIST of the generation the caller guessed   KEYS[5] = wake STREAM
-- KEYS[6] = heartbeats ZSET       KEYS[7] = worker status HASH KEYS[8] = events STREAM
-- KEYS[9] = (optional) counter STRING incremented by each release (the job's epoch)
-- ARGV[1] = worker id    ARGV[2] = ticket (unique per wait call, reused by its retries)
-- ARGV[3] = the generation KEYS[4] belongs to    ARGV[4] = expected: "live" or a count
-- ARGV[5] = key TTL, ms  ARGV[6] = outcomes kept in the state HASH
-- ARGV[7] = wake stream MAXLEN    ARGV[8] = watchers: arrivals 1..ARGV[8] block on streams
-- ARGV[9] = release list TTL, ms (short: watchers leave their tokens unread)
-- uses: lib/barrier.lua (live_arrived: the "live" check without a scan of the workers;
--   push_tokens: at most 4,096 release tokens now, the rest owed: see refill_release)
-- returns {0, generation, index, now_us, outcome, wake_id, events_id}
--   index: 1-based arrival order, 0 for a repeated arrival
--   outcome: "" (wait) | "R <gen> <released_us> <first_us> <participants> <counter|->"
--            | "B\n<gen>\n<culprit>\n<reason>\n<expected>\n<arrived>\n<absent>\n<absent id>..."
--              (absent: how many live workers had not arrived; the ids: up to 100 of them)
--            | "F" (the generation finished; its outcome was trimmed)
--   wake_id, events_id: stream ids a watcher reads after ("" for other arrivals)
-- | {1} NOT_REGISTERED | {3} FAILED | {4} LEFT
-- | {10, generation} the guess ARGV[3] is stale: call again with that generation
-- | {11, generation, expected} the generation is open with another expected
local id, ticket = ARGV[1], ARGV[2]
local status = redis.call('HGET', KEYS[7], id)
if not status then return {S.WORKER_NOT_REGISTERED} end
if status == 'failed' then return {S.WORKER_FAILED} end
if status == 'left' then return {S.WORKER_LEFT} end

local now_us = NOW_US()
local ttl = tonumber(ARGV[5])

local function last_id(key)
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  if last[1] then return last[1][1] end
  return '0-0'
end

-- 'broken' holds the generation that broke, until reset_barrier moves on
local state = redis.call('HMGET', KEYS[1], 'gen', 'expected', 'first_us', 'broken', 'ev')
local gen, expected, first_us = tonumber(state[1]), state[2], state[3]
if not gen then
  gen = 1
  redis.call('HSET', KEYS[1], 'gen', gen)
end

if ticket ~= '' then
  local prev = redis.call('HGET', KEYS[3], id)
  if prev then
    local sp = string.find(prev, ' ', 1, true)
    local pgen = tonumber(string.sub(prev, 1, sp - 1))
    if string.sub(prev, sp + 1) == ticket then
      local done = redis.call('HGET', KEYS[1], 'r:' .. pgen)
      if done then return {S.OK, pgen, 0, now_us, done, '', ''} end
      if pgen < gen then return {S.OK, pgen, 0, now_us, 'F', '', ''} end
      return {S.OK, pgen, 0, now_us, '', '', ''}
    end
  end
end

if gen ~= tonumber(ARGV[3]) then return {S.BARRIER_MOVED, gen} end
if tonumber(state[4]) == gen then
  return {S.OK, gen, 0, now_us, redis.call('HGET', KEYS[1], 'r:' .. gen), '', ''}
end

local opening = not expected
if opening then
  expected, first_us = ARGV[4], now_us
  -- 'ev': failures after this id concern this generation (check_barrier reads them)
  state[5] = last_id(KEYS[8])
  redis.call('HSET', KEYS[1], 'expected', expected, 'first_us', first_us, 'ev', state[5])
elseif expected ~= ARGV[4] then
  return {S.BARRIER_MISMATCH, gen, expected}
end

local added = redis.call('SADD', KEYS[2], id)
if ticket ~= '' then redis.call('HSET', KEYS[3], id, gen .. ' ' .. ticket) end
local n = redis.call('SCARD', KEYS[2])
local index = 0
if added == 1 then index = n end
if opening then
  -- outlives every waiter's timeout; the release and the next opening refresh it
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end

local full
if expected == 'live' then
  -- every live worker has arrived; the count comparison keeps this O(1) until it can hold,
  -- then live_arrived reads the events since the opening, not every worker
  local live = redis.call('ZCARD', KEYS[6])
  full = n >= live and live_arrived(n) >= live
else
  full = n >= tonumber(expected)
end

if not full then
  if not opening and redis.call('PTTL', KEYS[1]) < ttl / 2 then
    -- this waiter may wait longer than the keys would live (ttl >= 2 x its timeout)
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
  if index >= 1 and index <= tonumber(ARGV[8]) then
    -- a watcher starts from the generation's opening, so a failure just before its
    -- arrival still wakes it
    return {S.OK, gen, index, now_us, '', last_id(KEYS[5]), state[5]}
  end
  return {S.OK, gen, index, now_us, '', '', ''}
end

local counter = '-'
if NKEYS >= 9 then counter = redis.call('INCR', KEYS[9]) end
local outcome = 'R ' .. gen .. ' ' .. now_us .. ' ' .. first_us .. ' ' .. n .. ' ' .. counter
redis.call('HSET', KEYS[1], 'gen', gen + 1, 'r:' .. gen, outcome)
local old = gen - tonumber(ARGV[6])
redis.call('HDEL', KEYS[1], 'expected', 'first_us', 'ev', 'r:' .. old, 'owed:' .. old)
redis.call('UNLINK', KEYS[2])
-- tokens first, stream entry second: list waiters (the many) are served first
push_tokens(KEYS[1], KEYS[4], gen, outcome, n, tonumber(ARGV[9]))
redis.call('XADD', KEYS[5], 'MAXLEN', ARGV[7], '*', 'g', gen, 'o', outcome)
redis.call('PEXPIRE', KEYS[5], ttl)
return {S.OK, gen, index, now_us, outcome, '', ''}
