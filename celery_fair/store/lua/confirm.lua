--[[ confirm: the broker accepted these dispatches; their lease becomes the long one.
The message bytes stay in the record until a worker begins the dispatch (and while it
runs, for an acks_late task), so reclaim can hold the message again if the broker loses it
or the worker holding it dies.
KEYS[1]  fair queue prefix
ARGV[1]  lease deadline in ms
ARGV[2..] dispatch ids
Returns: the dispatch ids that are no longer current (their lease ran out and the message
was held again); the copies published for them will be skipped by the worker. A dispatch a
fast worker already began ('running', 'lost') or even released (no record) is not stale. ]]
-- @include common
local deadline = tonumber(ARGV[1])
local stale = {}
for i = 2, #ARGV do
  local did = ARGV[i]
  local dk = k_dispatch(did)
  local state = redis.call('HGET', dk, 's')
  if state == 'picked' then
    redis.call('HSET', dk, 's', 'queued')
    redis.call('ZADD', K_LEASES, deadline, did)
  elseif state == 'superseded' then
    stale[#stale + 1] = did
  end
end
return stale
