--[[ pause: pause or resume a group or the whole queue, or lift the pauses that are due
(`fair pause`, `fair resume`, the dispatcher's step). A paused group is not eligible
(common.lua `eligible`): it leaves the ready sets now and re-enters on resume; a paused
queue ('' in `pauses`) gives nothing to pick.lua. Caps and weights are not touched.
KEYS[1]  fair queue prefix
ARGV[1]  'pause', 'resume' or 'expire'
ARGV[2]  pause, resume: the group ('' the whole queue); expire: now in ms
ARGV[3]  pause: until when in ms ('inf': no end)
Returns: pause: 1; resume: 1 when it was paused, else 0; expire: the groups lifted. ]]
-- @include common
local function lift(g)
  if redis.call('ZREM', K_PAUSES, g) == 0 then return 0 end
  if g == '' or refresh(g) then wake() end
  return 1
end
local mode = ARGV[1]
if mode == 'pause' then
  redis.call('ZADD', K_PAUSES, ARGV[3], ARGV[2])
  if ARGV[2] ~= '' then refresh(ARGV[2]) end
  return 1
elseif mode == 'resume' then
  return lift(ARGV[2])
end
local due = redis.call('ZRANGEBYSCORE', K_PAUSES, '-inf', ARGV[2])
for _, g in ipairs(due) do lift(g) end
table.sort(due)
return due
