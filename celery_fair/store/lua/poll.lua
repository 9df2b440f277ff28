--[[ poll: take the wake markers of fair queues without blocking (RedisStore.wait with no
timeout: a busy dispatcher looks for wake-ups between steps; BLPOP would wait for the
server's next timer tick, ~100 ms, when none is there).
KEYS     the `wake` key of each fair queue looked at
Returns: the 1-based positions in KEYS of the keys that held a marker (now taken). ]]
local woken = {}
for i, key in ipairs(KEYS) do
  if redis.call('DEL', key) == 1 then woken[#woken + 1] = i end
end
return woken
