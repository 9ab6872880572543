-- expire_keys: one step of giving an ended job's keys its expiry (coordination/lifecycle.py
-- walks the job's keys with SCAN and sends them here in batches). Only while the job is
-- still ended with that expiry: a job opened again meanwhile is left alone. A key without
-- an expiry gets the job's; a key whose own expiry is later gets the job's + 1 ms (so
-- opening the job again, which clears exactly the job's, leaves it to expire with the end);
-- a key with a sooner expiry of its own keeps it. A key still carrying the expiry of an end
-- before the job was opened again ("reopened_from": that reopening's walk had not reached
-- it yet) gets this end's.
-- KEYS[1] = job record HASH   KEYS[2..] = keys of the job (one SCAN step's)
-- ARGV[1] = the end's expires_ms
-- returns {0, keys given an expiry} | {0, -1}: the job is not ended with that expiry now
local r = redis.call('HMGET', KEYS[1], 'state', 'expires_ms', 'reopened_from')
if r[1] ~= 'ended' or r[2] ~= ARGV[1] then return {S.OK, -1} end
local expires = tonumber(ARGV[1])
local before = tonumber(r[3] or '-3')
local n = 0
for i = 2, NKEYS do
  local at = redis.call('PEXPIRETIME', KEYS[i])
  if at == -1 or at == before then
    redis.call('PEXPIREAT', KEYS[i], expires)
    n = n + 1
  elseif at > expires + 1 then
    redis.call('PEXPIREAT', KEYS[i], expires + 1)
    n = n + 1
  end
end
return {S.OK, n}
