--[[ forget: drop a fair queue in which nothing is left from the namespace's set of fair
queues, so dispatchers stop stepping it. A later hold adds it to the set again.
KEYS[1]  fair queue prefix
KEYS[2]  the namespace's set of fair queues (keys.queues_key); none on a Redis Cluster (the
         set is in another slot): ClusterStore drops the queue first, and puts it back
         when this answers 0
ARGV[1]  the fair queue's name (its member of KEYS[2])
Returns: 1 when forgotten; 0 when it still holds, delays, has in flight or has
quarantined anything (then it stays in the set). ]]
-- @include common
if redis.call('HLEN', K_MSG) > 0 or redis.call('ZCARD', K_DELAYED) > 0
    or redis.call('ZCARD', K_LEASES) > 0 or redis.call('HLEN', K_QUARANTINE) > 0
    or tonumber(redis.call('HGET', K_STAT, 'inflight') or '0') > 0 then
  return 0
end
if not KEYS[2] then return 1 end
return redis.call('SREM', KEYS[2], ARGV[1])
