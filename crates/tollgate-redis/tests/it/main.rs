//! Integration tests of `RedisStore`; each test starts its own `redis-server`.

mod concurrency;
mod connect;
mod failure;
mod layout;
mod parity;
mod redis_time;
mod round_trip;
mod script;
mod support;
