--[[ release: dispatch ARGV[1] ended (success, failure, retry, revoke...); free its slot.
Idempotent: releasing an unknown or already released dispatch does nothing.
KEYS[1]  fair queue prefix
ARGV[1]  dispatch id
ARGV[2]  seconds to keep a tombstone (the task ran to its end in the pool, so a copy the
         broker redelivers later must not run again: begin skips it); 0 (a release that
         must not block a redelivery: revoked, rejected, a lost pool process) keeps none.
         The record is deleted either way; the tombstone is the dispatch id in a small
         shared hash (k_done), at least this long.
ARGV[3]  the run that ends ('' for any): when another run has taken the dispatch over
         (its copy, after this run's process was found gone), this release is not its
         to make and does nothing
Counts the release in `stat` `released` (the metrics' counter of ended dispatches).
Returns: 1 slot freed, 0 nothing to do. ]]
-- @include common
local did, done_ttl = ARGV[1], tonumber(ARGV[2] or '0')
local dk = k_dispatch(did)
local state, runner = unpack(redis.call('HMGET', dk, 's', 'x'))
if not state or state == 'superseded' or state == 'released' then return 0 end
if ARGV[3] and ARGV[3] ~= '' and runner and runner ~= ARGV[3] then return 0 end
local g, cls = unpack(redis.call('HMGET', dk, 'g', 'c'))
redis.call('DEL', dk)
if done_ttl > 0 then
  local done = k_done(did)
  redis.call('HSET', done, did, '')
  -- The hash lives until its last tombstone is due: extended, never shortened (a worker
  -- with a shorter fair_done_ttl must not cut the others' short).
  if redis.call('TTL', done) < done_ttl then redis.call('EXPIRE', done, done_ttl) end
end
redis.call('ZREM', K_LEASES, did)
redis.call('HINCRBY', K_STAT, 'released', 1)
if state == 'lost' then return 0 end
free_slot(g, cls)
wake()
return 1
