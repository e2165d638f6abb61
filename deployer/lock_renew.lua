-- Renews the deploy lock's lease if this deploy still holds it.
-- KEYS[1] -> the lock key
-- ARGV[1] -> the holder's value (owner, "|", random token), as written by SET NX
-- ARGV[2] -> the lease in milliseconds
-- Returns 1 when renewed, 0 when the key expired or another deploy holds it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
