--[[ release: dispatch ARGV[1] ended (success, failure, retry, revoke...); free its slot.
Idempotent: releasing an unknown or already released dispatch does nothing.
KEYS[1]  fair queue prefix
ARGV[1]  dispatch id
Returns: 1 slot freed, 0 nothing to do. ]]
-- @include common
local did = ARGV[1]
local dk = k_dispatch(did)
local state = redis.call('HGET', dk, 's')
if not state or state == 'superseded' then return 0 end
local g = redis.call('HGET', dk, 'g')
redis.call('DEL', dk)
redis.call('ZREM', K_LEASES, did)
if state == 'lost' then return 0 end
free_slot(g)
wake()
return 1
