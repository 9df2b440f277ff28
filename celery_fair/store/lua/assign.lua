--[[ assign: set the worker of groups (fair_affinity), as the dispatcher computed them.
A change applies only if the group's worker is still the one the dispatcher read ('*':
whatever it is), so two dispatchers making one change make it once, and count its move
once. A group the queue no longer knows (not in `groups`: it idled and was forgotten) is
dropped from the map instead, so the map holds the groups with work; it is assigned again
when it comes back (pick.lua reports it).
KEYS[1]  fair queue prefix
ARGV     triples: group, its worker as read ('' for none, '*' for any), its new worker
Counts in `stat` `moves` the groups moved from one worker to another.
Returns: {groups set, moves}. ]]
-- @include common
local set, moves = 0, 0
for i = 1, #ARGV - 2, 3 do
  local g, old, new = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local current = redis.call('HGET', K_AFF, g) or ''
  if old == '*' or current == old then
    if redis.call('SISMEMBER', K_GROUPS, g) == 0 then
      redis.call('HDEL', K_AFF, g)
    elseif current ~= new then
      redis.call('HSET', K_AFF, g, new)
      set = set + 1
      if current ~= '' then moves = moves + 1 end
    end
  end
end
if moves > 0 then redis.call('HINCRBY', K_STAT, 'moves', moves) end
return {set, moves}
