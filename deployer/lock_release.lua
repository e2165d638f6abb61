-- Releases the deploy lock if this deploy still holds it, and never another deploy's.
-- KEYS[1] -> the lock key
-- ARGV[1] -> the holder's value (owner, "|", random token), as written by SET NX
-- Returns 1 when released, 0 when the key had already expired or belongs to another deploy.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
