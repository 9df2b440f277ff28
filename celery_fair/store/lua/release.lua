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
ARGV[4]  seconds the task ran, as the worker measured it ('' or absent: none reported, an
         older worker or a release kept for retry): a dispatch the pick charged an
         estimate (record field `e`, charge 'runtime') corrects its group's tag of its
         class by (runtime - estimate) / weight before its slot is freed (policy
         `corrected`), and the runtime goes into the group's mean runtime (`r`, the
         estimate of its next dispatches: policy `mean_runtime`); a lost dispatch, or one
         released under Harmony, corrects nothing
A dispatch with a singleton key (record field `k`) passes the key to its next waiter.
ARGV[5]  now in ms ('' or absent: Redis's clock): the head time of a singleton key's next
         waiter (below)
Counts the release in `stat` `released` (the metrics' counter of ended dispatches).
Refill: while a dispatcher's refill parameters are there (`refill`, written by pick.lua
with an expiry), the freed slot is filled here, by the pick itself (include/picking.lua)
with its direct push: no wake-up, no dispatcher step per task. What it pushed goes to
`refilled` for the dispatcher's logs and metrics (it is woken once REFILL.TELL fields
wait), what it took but could not push to `handoff` (the dispatcher is woken to publish
it, as though it had picked it): PICK.refill. Without the parameters, the dispatcher is
woken.
Returns: 1 slot freed, 0 nothing to do. ]]
-- @include common
-- @include singleton
-- @include kombu
-- @include routing
-- @include subcaps
-- @include picking
local did, done_ttl = ARGV[1], tonumber(ARGV[2] or '0')
local dk = k_dispatch(did)
local state, runner, g, cls, estimate, w, key, sg =
  unpack(redis.call('HMGET', dk, 's', 'x', 'g', 'c', 'e', 'w', 'k', 'sg'))
if not state or state == 'superseded' or state == 'released' then return 0 end
if ARGV[3] and ARGV[3] ~= '' and runner and runner ~= ARGV[3] then return 0 end
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
-- A corrected tag must reach the ready (or over) set's score too: then refresh whatever the cap.
local corrected = false
local runtime, charged = finite(ARGV[4]), finite(estimate)
if runtime and runtime >= 0 and runtime <= MAX_RUNTIME and charged and not harmony() then
  local gk = k_group(g)
  local mean = finite(redis.call('HGET', gk, 'r'))
  redis.call('HSET', gk, 'r', mean and mean + (runtime - mean) / RUNTIME_SMOOTHING or runtime)
  local tag = finite(redis.call('HGET', gk, 't' .. cls))
  if tag then
    local w = pick_weight_of(g, valid_weight(redis.call('HGET', K_CONF, 'weight')) or 1)
    redis.call('HSET', gk, 't' .. cls, tag + (runtime - charged) / w)
    SC.charged(cls, g, (runtime - charged) / w)  -- wfq shares across queues
    corrected = true
  end
end
free_slot(g, cls, not corrected)
SUBCAPS.freed(g, sg)  -- its subgroup's room: what is parked for it comes back
worker_slot(w, -1)
if key then singleton_ended(key, did, finite(ARGV[5]) or singleton_now()) end  -- its next waiter enters

if not PICK.refill(finite(ARGV[5])) then wake() end
return 1
