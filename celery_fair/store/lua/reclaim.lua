--[[ reclaim: take back the slots of dispatches whose lease ran out.
A 'picked' dispatch (its dispatcher died before the broker took it) is held again at the
head of its group and marked 'superseded', so a copy that did reach the broker is skipped.
A 'queued' or 'running' one (its worker died) becomes 'lost': the broker still owns the
message and will redeliver it; whoever runs it then takes a slot again (begin.lua).
KEYS[1]  fair queue prefix
ARGV[1]  now in ms
ARGV[2]  most dispatches to reclaim
ARGV[3]  seconds to keep the record of a superseded or lost dispatch
Returns: {held again, lost}. ]]
-- @include common
local now, limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local requeued, lost = 0, 0
for _, did in ipairs(redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', K_LEASES, did)
  local dk = k_dispatch(did)
  local state, g, cls, id, value = unpack(redis.call('HMGET', dk, 's', 'g', 'c', 'id', 'v'))
  if state == 'picked' then
    if redis.call('HEXISTS', K_MSG, id) == 1 then
      id = id .. '~' .. did
      redis.call('HINCRBY', K_STAT, 'dup', 1)  -- cancel looks for suffixed copies
    end
    redis.call('HSET', K_MSG, id, value)
    redis.call('LPUSH', k_list(cls, g), id)
    redis.call('HSET', dk, 's', 'superseded')
    redis.call('HDEL', dk, 'v')
    redis.call('EXPIRE', dk, ttl)
    requeued = requeued + 1
    free_slot(g)
  elseif state == 'queued' or state == 'running' then
    redis.call('HSET', dk, 's', 'lost')
    redis.call('EXPIRE', dk, ttl)
    lost = lost + 1
    free_slot(g)
  end
end
if requeued + lost > 0 then wake() end
return {requeued, lost}
