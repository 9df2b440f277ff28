--[[ begin: a worker is about to run dispatch ARGV[1]. Decides whether it may.
KEYS[1]  fair queue prefix
ARGV[1]  dispatch id
ARGV[2]  lease deadline in ms
ARGV[3]  now in ms
ARGV[4]  this run's token (unique per run)
ARGV[5]  '1': the task acks late, so keep the message bytes with the record while it
         runs: should its worker die, reclaim holds the message again itself (and the
         copy the broker redelivers is skipped); '0': drop them (the broker has the
         message acked; a dead run is lost, as in Celery)
ARGV[6]  this host's prefix of run tokens ('' for none): when the run a copy would be
         skipped for is one of this host's, its token is returned instead, for the caller
         to see whether that run's process is gone (a pool process killed mid-task)
ARGV[7]  the token of such a run that the caller found gone ('' for none): take it over
Returns: the token of a run of this host (see ARGV[6]); else 1 run (dispatch current), 2 run (its slot had been reclaimed and was taken
again), 0 run (unknown dispatch: never held back, or its record expired), -1 skip (counted
in `stat` `skipped`): a stale duplicate (the message was held again after its lease ran
out and a newer dispatch carries it), a copy of a dispatch that already ran to its end
(the broker redelivered it), or a copy of a dispatch another run is running under a live
lease while its bytes are kept (the broker redelivered it after a lost connection; should
that run die, reclaim holds the message again). A skip takes no slot and changes no
record. ]]
-- @include common
local did, deadline, now, token = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local dk = k_dispatch(did)
-- Not the bytes themselves: only whether they are kept, and only for a copy.
local state, runner, kept = unpack(redis.call('HMGET', dk, 's', 'x', 'a'))
-- 'released': a record an older version kept as the tombstone; now the record goes and
-- the tombstone is in k_done
if state == 'superseded' or state == 'released'
    or (not state and redis.call('HEXISTS', k_done(did), did) == 1) then
  redis.call('HINCRBY', K_STAT, 'skipped', 1)
  return -1
end
if state == 'running' and runner and runner ~= token and runner ~= ARGV[7] and kept == '1'
    and redis.call('HEXISTS', dk, 'v') == 1
    and tonumber(redis.call('ZSCORE', K_LEASES, did) or '0') > now then
  local host = ARGV[6]
  if host ~= '' and string.sub(runner, 1, #host) == host then return runner end
  redis.call('HINCRBY', K_STAT, 'skipped', 1)
  return -1
end
state = hold_lease(did, deadline, state)
if not state then return 0 end
redis.call('HSET', dk, 's', 'running', 'x', token)
if ARGV[5] == '1' then
  redis.call('HSET', dk, 'a', '1')
else
  redis.call('HDEL', dk, 'v', 'a')
end
if state == 'lost' then return 2 end
return 1
