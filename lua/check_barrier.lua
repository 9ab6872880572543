-- check_barrier: settle one generation of a named barrier. Waiters run it when a membership
-- event wakes them and when a blocking slice ends; abort() and a waiter's timeout force a
-- break. A generation breaks when, after it opened, an arrived member was declared failed,
-- or (expected "live") any live worker was, or (a count) a failure left too few workers
-- to ever complete it. A break records the outcome and wakes every waiter at once. A
-- graceful leave can complete an "expected live" generation, which is then released.
-- KEYS[1] = barrier state HASH    KEYS[2] = arrived SET       KEYS[3] = tickets HASH
-- KEYS[4] = release LIST of generation ARGV[1]                KEYS[5] = wake STREAM
-- KEYS[6] = heartbeats ZSET       KEYS[7] = worker status HASH KEYS[8] = events STREAM
-- KEYS[9] = (optional) counter STRING incremented by a release (the job's epoch)
-- ARGV[1] = generation   ARGV[2] = action: "check" | "timeout" | "abort"
-- ARGV[3] = the aborting or timed-out worker ("" for an operator)
-- ARGV[4] = abort reason ARGV[5] = key TTL, ms   ARGV[6] = outcomes kept in the state HASH
-- ARGV[7] = wake stream MAXLEN    ARGV[8] = at most this many membership events scanned
-- ARGV[9] = release list TTL, ms
-- uses: lib/barrier.lua (live_arrived, absent_ids: no scan of every worker; push_tokens)
-- returns {0, outcome}: "" (still open) | "R ..." released | "B\n..." broken (formats as in
--   arrive_barrier) | "F" finished, outcome trimmed | "G" no such generation (expired)
-- | {1} NOT_REGISTERED (an abort by an unknown worker)
local g, action, who = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local ttl = tonumber(ARGV[5])
if action == 'abort' and who ~= '' and not redis.call('HGET', KEYS[7], who) then return {S.WORKER_NOT_REGISTERED} end

local cur = tonumber(redis.call('HGET', KEYS[1], 'gen'))
if not cur and action == 'abort' and g == 1 then
  -- an abort before the barrier's first use still refuses the arrivals that follow
  cur = 1
  redis.call('HSET', KEYS[1], 'gen', cur)
end
if not cur or g > cur then return {S.OK, 'G'} end
local done = redis.call('HGET', KEYS[1], 'r:' .. g)
if done then return {S.OK, done} end
if g < cur then return {S.OK, 'F'} end

local expected = redis.call('HGET', KEYS[1], 'expected')

local function push(token, n)
  push_tokens(KEYS[1], KEYS[4], g, token, n, tonumber(ARGV[9]))
end

local function wake(outcome)
  redis.call('XADD', KEYS[5], 'MAXLEN', ARGV[7], '*', 'g', g, 'o', outcome)
  redis.call('PEXPIRE', KEYS[5], ttl)
  redis.call('PEXPIRE', KEYS[1], ttl)
end

-- live workers that have not arrived (O(events since the opening): lib/barrier_live.lua)
local function absent_count(n)
  return redis.call('ZCARD', KEYS[6]) - live_arrived(n)
end

-- the generation stays broken ('broken' = g: arrivals refused) until reset_barrier
local function broke(culprit, reason)
  local n = redis.call('SCARD', KEYS[2])
  local absent = absent_ids(100)
  local rec = 'B\n' .. g .. '\n' .. culprit .. '\n' .. reason .. '\n' .. (expected or '')
    .. '\n' .. n .. '\n' .. math.max(absent_count(n), #absent)
  if #absent > 0 then rec = rec .. '\n' .. table.concat(absent, '\n') end
  redis.call('HSET', KEYS[1], 'r:' .. g, rec, 'broken', g)
  push('B ' .. g, n)
  wake(rec)
  return {S.OK, rec}
end

if action == 'abort' then return broke(who, ARGV[4]) end
if not expected then return {S.OK, ''} end

local fails = {}
local after = redis.call('HGET', KEYS[1], 'ev') or '0-0'
for _, e in ipairs(redis.call('XRANGE', KEYS[8], '(' .. after, '+', 'COUNT', ARGV[8])) do
  local f, kind, worker = e[2], nil, nil
  for i = 1, #f, 2 do
    if f[i] == 'type' then kind = f[i + 1] elseif f[i] == 'worker' then worker = f[i + 1] end
  end
  if kind == 'fail' and worker then fails[#fails + 1] = worker end
end

if #fails > 0 then
  if expected == 'live' then return broke(fails[1], 'failed') end
  for _, w in ipairs(fails) do
    if redis.call('SISMEMBER', KEYS[2], w) == 1 then return broke(w, 'failed') end
  end
  local n = redis.call('SCARD', KEYS[2])
  if n + absent_count(n) < tonumber(expected) then
    return broke(fails[#fails], 'failed')
  end
end

local n = redis.call('SCARD', KEYS[2])
-- every live worker has arrived; the count comparison keeps this O(1) until it can hold
if expected == 'live' and n > 0 and n >= redis.call('ZCARD', KEYS[6]) and absent_count(n) <= 0 then
  local counter = '-'
  if NKEYS >= 9 then counter = redis.call('INCR', KEYS[9]) end
  local now_us = NOW_US()
  local first_us = redis.call('HGET', KEYS[1], 'first_us')
  local rec = 'R ' .. g .. ' ' .. now_us .. ' ' .. first_us .. ' ' .. n .. ' ' .. counter
  redis.call('HSET', KEYS[1], 'gen', g + 1, 'r:' .. g, rec)
  local old = g - tonumber(ARGV[6])
  redis.call('HDEL', KEYS[1], 'expected', 'first_us', 'ev', 'r:' .. old, 'owed:' .. old)
  redis.call('UNLINK', KEYS[2])
  push(rec, n)
  wake(rec)
  return {S.OK, rec}
end

if action == 'timeout' then
  return broke(absent_ids(1)[1] or '', 'timeout')
end
return {S.OK, ''}
