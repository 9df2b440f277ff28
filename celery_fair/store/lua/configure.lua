--[[ configure: set the fair queue's policy settings and re-rank every group under them.
Runs when a dispatcher starts (settings from app.conf); not on the hot path.
KEYS[1]  fair queue prefix
ARGV[1]  default cap (-1: none)
ARGV[2]  interactive reserve
ARGV[3]  default weight
ARGV[4]  cap overrides as JSON {group: cap}
ARGV[5]  weight overrides as JSON {group: weight}
Returns: number of groups re-ranked. ]]
-- @include common
redis.call('HSET', K_CONF, 'cap', ARGV[1], 'reserve', ARGV[2], 'weight', ARGV[3])
redis.call('DEL', K_CAPS, K_WEIGHTS)
for g, cap in pairs(cjson.decode(ARGV[4])) do redis.call('HSET', K_CAPS, g, cap) end
for g, w in pairs(cjson.decode(ARGV[5])) do redis.call('HSET', K_WEIGHTS, g, w) end
local groups = redis.call('SMEMBERS', K_GROUPS)
for _, g in ipairs(groups) do refresh(g) end
wake()
return #groups
