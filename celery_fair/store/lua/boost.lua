--[[ boost: boost a group's weight, end a boost, or end the boosts that are due
(`fair boost`, `fair boost --reset`, the dispatcher's step). The boost weight is kept in
`boosts`, apart from the weights in force (configure.lua, limit.lua): common.lua
`pick_weight_of` reads it first, so ending a boost needs nothing restored. Under Harmony
the weight is part of the group's rank: a boost and its end re-rank the group.
KEYS[1]  fair queue prefix
ARGV[1]  'boost', 'unboost' or 'expire'
ARGV[2]  boost, unboost: the group; expire: now in ms
ARGV[3]  boost: the weight
ARGV[4]  boost: until when in ms ('inf': no end)
Returns: boost: 1; unboost: 1 when it was boosted, else 0; expire: the groups ended. ]]
-- @include common
-- g's weight in force changed: under Harmony its rank with it (common.lua harmony_rank)
local function rerank(g)
  if harmony() then refresh(g) end
end
local function unboost(g)
  redis.call('HDEL', K_BOOSTS, g)
  local was = redis.call('ZREM', K_BOOSTS_UNTIL, g)
  if was == 1 then rerank(g) end
  return was
end
local mode = ARGV[1]
if mode == 'boost' then
  if not valid_weight(ARGV[3]) then return redis.error_reply('invalid boost weight') end
  redis.call('HSET', K_BOOSTS, ARGV[2], ARGV[3])
  redis.call('ZADD', K_BOOSTS_UNTIL, ARGV[4], ARGV[2])
  rerank(ARGV[2])
  return 1
elseif mode == 'unboost' then
  return unboost(ARGV[2])
end
local due = redis.call('ZRANGEBYSCORE', K_BOOSTS_UNTIL, '-inf', ARGV[2])
for _, g in ipairs(due) do unboost(g) end
table.sort(due)
return due
