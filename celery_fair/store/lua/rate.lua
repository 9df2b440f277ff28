--[[ rate: set, clear or read a group's runtime rate limit, or throttle a group
(`fair limit --rate`, a task's `fair_throttle`). A runtime rate is kept in `limit:rates`
(configure.lua never touches it) and written into `rates`, the values in force; reset
puts the setting (`conf:rates`) back. A change of the rate in force starts the group's
bucket full (its TAT goes) and lifts the throttle its old rate gave it, not a task's
(common.lua `rerate`); the same rate again changes nothing. A throttled group is not
eligible (common.lua `eligible`) until promote.lua lifts it.
KEYS[1]  fair queue prefix
ARGV[1]  'set' or 'throttle'
ARGV[2]  the group
ARGV[3]  set: '<interval ms>:<burst>', 'none' (no rate limit), 'reset' or '' (read);
         throttle: until when in ms
Returns: set: the rate in force ('none': none); throttle: when its throttle ends.
Error (before anything is written): a rate out of range (common.lua bounds). ]]
-- @include common
local g, value = ARGV[2], ARGV[3]
local interval, burst = rate_of(g)  -- in force before
if ARGV[1] == 'throttle' then
  local current = tonumber(redis.call('ZSCORE', K_THROTTLED, g))
  if not current or tonumber(value) > current then
    redis.call('ZADD', K_THROTTLED, value, g)
    current = tonumber(value)
  end
  refresh(g)
  return string.format('%.17g', current)
end
if value == 'reset' then
  redis.call('HDEL', K_LIMIT_RATES, g)
  local setting = redis.call('HGET', K_CONF_RATES, g)
  if setting and valid_rate(setting) then
    redis.call('HSET', K_RATES, g, setting)
  else  -- none, or damaged: `check` says so
    redis.call('HDEL', K_RATES, g)
  end
elseif value ~= '' then
  if not valid_rate(value) then
    return redis.error_reply('ERR rate limit for group ' .. g .. ' must be ' ..
                             "'<interval ms>:<burst>' or 'none', got " .. value)
  end
  redis.call('HSET', K_LIMIT_RATES, g, value)
  redis.call('HSET', K_RATES, g, value)
end
if value ~= '' and rerate(g, interval, burst) and refresh(g) then wake() end
return redis.call('HGET', K_RATES, g) or redis.call('HGET', K_CONF, 'rate') or 'none'
