-- A test app's own script, autodiscovered as "testapp.echo".
-- KEYS[1]: a key to SET; ARGV[1]: the value. Returns the value read back.
redis.call('SET', KEYS[1], ARGV[1])
return redis.call('GET', KEYS[1])
