--[[ begin: a worker is about to run dispatch ARGV[1]. Decides whether it may.
KEYS[1]  fair queue prefix
ARGV[1]  dispatch id
ARGV[2]  lease deadline in ms
Returns: 1 run (dispatch current), 2 run (its slot had been reclaimed and was taken
again), 0 run (unknown dispatch: never held back), -1 skip (a stale duplicate: the
message was held again after its lease ran out, and a newer dispatch carries it). ]]
-- @include common
local state = take(ARGV[1], tonumber(ARGV[2]))
if state == 'superseded' then return -1 end
if not state then return 0 end
if state == 'lost' then return 2 end
return 1
