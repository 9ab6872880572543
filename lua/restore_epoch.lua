-- restore_epoch: put the job's epoch back to a checkpoint's, once per restore. The first
-- member of the restoring round to call sets it; the others' calls with the same mark change
-- nothing, so a member that resumes late never moves back an epoch its round has moved on
-- since. The members call it before they put any dataset's lease pool back
-- (restore_position.lua, which leaves the epoch alone: this script and the epoch barrier's
-- release are the only writers of the job's epoch).
-- KEYS[1] = the job's epoch STRING   KEYS[2] = the epoch's restore mark STRING
-- ARGV[1] = the checkpoint's epoch   ARGV[2] = the mark (the restoring round)
-- returns {S.OK, applied}: applied = 1 when this call set the epoch, 0 when the mark was set
if redis.call('GET', KEYS[2]) == ARGV[2] then return {S.OK, 0} end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return {S.OK, 1}
