-- refill_release: push the next batch of a barrier generation's owed release tokens. A
-- release (or break) pushes at most 4,096 tokens at once and leaves the rest owed, with the
-- first token of the batch marked "+" (lib/barrier.lua, push_tokens): the waiter that pops
-- the marked token runs this, which pushes the next batch the same way. Owed tokens that no
-- one refills (that waiter died) cost the others one blocking slice: they then read the
-- generation's outcome from its record.
-- KEYS[1] = barrier state HASH (field 'owed:<gen>' = "<count>\n<token>")
-- KEYS[2] = release LIST of the generation
-- ARGV[1] = the generation   ARGV[2] = release list TTL, ms
-- returns {0, tokens pushed now, tokens still owed after them}
-- uses: lib/barrier.lua (push_tokens)
local owed = redis.call('HGET', KEYS[1], 'owed:' .. ARGV[1])
if not owed then return {S.OK, 0, 0} end
local nl = string.find(owed, '\n', 1, true)
local count, token = tonumber(string.sub(owed, 1, nl - 1)), string.sub(owed, nl + 1)
push_tokens(KEYS[1], KEYS[2], ARGV[1], token, count, tonumber(ARGV[2]))
local now = math.min(count, TOKENS_NOW)
return {S.OK, now, count - now}
