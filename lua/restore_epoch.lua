-- restore_epoch: put the job's epoch back to a checkpoint's, once per restore. The first
-- member of the restoring round to call sets it and records, with the mark, the epoch it
-- replaced; the others' calls with the same mark change nothing and are told that same
-- epoch, so every member drops the same later epochs' pools whenever it calls (a member
-- reading the epoch itself could read the one already put back, and keep a later epoch's
-- pool). A member that resumes late never moves back an epoch its round has moved on
-- since. The members call it before they put any dataset's lease pool back
-- (restore_position.lua, which leaves the epoch alone: this script and the epoch barrier's
-- release are the only writers of the job's epoch).
-- KEYS[1] = the job's epoch STRING   KEYS[2] = the epoch's restore mark STRING ("<mark> <epoch
--           it replaced>")
-- ARGV[1] = the checkpoint's epoch   ARGV[2] = the mark (the restoring round)
-- returns {S.OK, applied, replaced}: applied = 1 when this call set the epoch, 0 when the
--         mark was set; replaced = the job's epoch before the round's restore (0: none)
local stored = redis.call('GET', KEYS[2])
if stored then
  local mark, replaced = string.match(stored, '^(%d+) (%d+)$')
  if mark == ARGV[2] then return {S.OK, 0, tonumber(replaced)} end
end
local replaced = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. replaced)
return {S.OK, 1, replaced}
