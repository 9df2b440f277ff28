--[[ renew: workers still hold these dispatches (received or running); extend their leases.
KEYS[1]  fair queue prefix
ARGV[1]  lease deadline in ms
ARGV[2..] dispatch ids
Returns: number of dispatches renewed. ]]
-- @include common
local deadline, renewed = tonumber(ARGV[1]), 0
for i = 2, #ARGV do
  local state = hold_lease(ARGV[i], deadline)
  if state and state ~= 'superseded' and state ~= 'released' then renewed = renewed + 1 end
end
return renewed
