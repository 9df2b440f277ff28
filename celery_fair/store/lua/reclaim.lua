--[[ reclaim: take back the slots of dispatches whose lease ran out.
A 'picked' dispatch (its dispatcher died before the broker took it) or a 'queued' one (the
broker took it but no worker ever reported it: the broker may have lost it, e.g. a Redis
broker restarting while a worker popped it) is held again at the head of its group (its head time
`h<class>` stamped now) and marked 'superseded', so a copy that does reach a worker is skipped.
So is a 'running' one whose run kept the bytes (an acks_late task, see begin.lua): its
worker died, and the copy the broker redelivers is skipped.
Any other 'running' one becomes 'lost': the broker owns the message (acks_late without
bytes: it redelivers it, and whoever runs it then takes a slot again; acks early: the run
is lost, as in Celery). So does a 'queued' or 'picked' one without its bytes (confirmed by
an older version, or damaged): there is nothing to hold again, and the broker may have the
message (a picked one may have been published), so a copy that reaches a worker runs and
takes its slot again; its slot is freed either way, never left to leak.
KEYS[1]  fair queue prefix
ARGV[1]  now in ms
ARGV[2]  most dispatches to reclaim
ARGV[3]  seconds to keep the record of a superseded or lost dispatch
A dispatch with a singleton key (`k`) held again keeps its key (or waits first in the
key's list when it passed on); a lost one passes it to its next waiter.
Returns: {held again, lost}. ]]
-- @include common
-- @include singleton
-- @include subcaps
local now, limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local requeued, lost = 0, 0
for _, did in ipairs(redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', K_LEASES, did)
  local dk = k_dispatch(did)
  local state, g, cls, id, value, kept, w, key, sg =
    unpack(redis.call('HMGET', dk, 's', 'g', 'c', 'id', 'v', 'a', 'w', 'k', 'sg'))
  -- its subgroup's room first: what it unparks goes behind a message held again below,
  -- which goes first as every retry
  if state == 'picked' or state == 'queued' or state == 'running' then SUBCAPS.freed(g, sg) end
  if value and (state == 'picked' or state == 'queued'
                or (state == 'running' and kept == '1')) then
    if redis.call('HEXISTS', K_MSG, id) == 1 then id = id .. '~' .. did end
    index_copy(id)  -- a copy (this one, or one picked before) is found by cancel
    redis.call('HSET', K_MSG, id, value)
    -- a singleton keeps its key, or waits first in its list (the key passed on)
    if not key or singleton_requeued(key, did, id) then
      redis.call('LPUSH', k_list(cls, g), id)
      redis.call('HSET', k_group(g), 'h' .. cls, ARGV[1])  -- the head since now
      count_held(cls, g, 1)
    end
    redis.call('HSET', dk, 's', 'superseded')
    redis.call('HDEL', dk, 'v', 'a')
    redis.call('EXPIRE', dk, ttl)
    requeued = requeued + 1
    free_slot(g, cls)
    worker_slot(w, -1)
  elseif state == 'picked' or state == 'queued' or state == 'running' then
    redis.call('HSET', dk, 's', 'lost')
    redis.call('EXPIRE', dk, ttl)
    lost = lost + 1
    -- the key passes on with the slot, its next waiter entering before the slot is
    -- freed: the group is not idle (its tag kept) while its own work waited for the key
    singleton_ended(key, did, ARGV[1])
    free_slot(g, cls)
    worker_slot(w, -1)
  end
end
if requeued + lost > 0 then wake() end
return {requeued, lost}
