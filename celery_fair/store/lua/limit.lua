--[[ limit: set or clear a group's runtime cap and weight (`celery fair limit`).
A limit is kept in `limit:caps`/`limit:weights` (configure.lua never touches those, so it
survives dispatcher restarts) and written into `caps`/`weights`, the values in force;
reset puts the setting (`conf:caps`/`conf:weights`) back. The group is re-ranked at once.
KEYS[1]  fair queue prefix
ARGV[1]  group
ARGV[2]  cap: an integer (-1: no cap), '' to leave it, 'reset' to clear it
ARGV[3]  weight: a number, '' to leave it, 'reset' to clear it
Returns: {cap, weight} now in force (runtime or setting; cap -1: none), as strings.
A cap keyed by a subgroup path ("<group>/<subgroup>") under fair_subgroup 'path' caps
that subgroup (include/subcaps.lua): what it has room for now is unparked.
Error (before anything is written): a cap or weight out of range (common.lua bounds). ]]
-- @include common
-- @include subcaps
local g = ARGV[1]
local function refuse(name, value, expected)
  return redis.error_reply('ERR ' .. name .. ' for group ' .. g .. ' must be ' .. expected ..
                           ', got ' .. value)
end
if ARGV[2] ~= '' and ARGV[2] ~= 'reset' and not valid_cap(ARGV[2]) then
  return refuse('concurrency', ARGV[2], 'an integer from -1 (none) to ' .. MAX_CAP)
end
if ARGV[3] ~= '' and ARGV[3] ~= 'reset' and not valid_weight(ARGV[3]) then
  return refuse('weight', ARGV[3], 'a finite number between ' .. MIN_WEIGHT .. ' and ' ..
                MAX_WEIGHT)
end
local valid = {valid_cap, valid_weight}
for i, k in ipairs({{K_LIMIT_CAPS, K_CAPS, K_CONF_CAPS},
                    {K_LIMIT_WEIGHTS, K_WEIGHTS, K_CONF_WEIGHTS}}) do
  local limits, in_force, settings = k[1], k[2], k[3]
  local value = ARGV[i + 1]
  if value == 'reset' then
    redis.call('HDEL', limits, g)
    local setting = redis.call('HGET', settings, g)
    if setting and not valid[i](setting) then setting = nil end  -- damaged: `check` says so
    if setting then redis.call('HSET', in_force, g, setting) else redis.call('HDEL', in_force, g) end
  elseif value ~= '' then
    redis.call('HSET', limits, g, value)
    redis.call('HSET', in_force, g, value)
  end
end
-- a cap keyed by a path: picks look at heads' subgroups from now on (conf `pathcaps`;
-- configure.lua clears it when no such cap is left)
if ARGV[2] ~= '' and ARGV[2] ~= 'reset' and string.find(g, '/', 1, true) then
  redis.call('HSET', K_CONF, 'pathcaps', '1')
end
if refresh(g) then wake() end
-- a subgroup's cap (caps per subgroup): what it has room for now is unparked
local slash = ARGV[2] ~= '' and string.find(g, '/', 1, true)
if slash and redis.call('SCARD', SUBCAPS.parked) > 0 then
  SUBCAPS.unpark(string.sub(g, 1, slash - 1), string.sub(g, slash + 1))
end
local default_weight = valid_weight(redis.call('HGET', K_CONF, 'weight')) or 1
return {tostring(cap_of(g)), tostring(weight_of(g, default_weight))}
