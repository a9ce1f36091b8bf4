//! Duplicate-guard locks: set-if-absent with a token, compare-and-delete, complete.

use std::time::Duration;

use super::{
    Inner,
    map::{Entry, Kind, State},
};
use crate::{
    error::{StoreError, StoreErrorKind},
    store::{HeldLock, LockReply},
};

pub(super) struct LockState {
    token: String,
    fingerprint: String,
    completed: bool,
    response: Option<Vec<u8>>,
}

impl Inner {
    pub(super) fn lock_acquire(
        &self,
        key: &str,
        token: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<LockReply, StoreError> {
        let hash = self.shards.hash(key);
        let mut shard = self.shards.lock_one(hash);
        let now = self.clock.now_us();
        if let Some(Entry {
            state: State::Lock(lock),
            expires_at,
            ..
        }) = shard.live(hash, key, now)
        {
            // Its holder, asking again (a call sent twice).
            if lock.token == token && !lock.completed {
                return Ok(LockReply::Acquired);
            }
            return Ok(LockReply::Held(HeldLock {
                completed: lock.completed,
                ttl_left_us: *expires_at - now,
                fingerprint: lock.fingerprint.clone(),
                response: lock.response.clone(),
            }));
        }
        if shard.find(hash, key).is_none() && !self.make_room(&mut shard, Kind::Lock, 1, now, &[]) {
            return Err(StoreError::new(
                StoreErrorKind::Capacity,
                format!(
                    "the duplicate-guard lock budget is full ({} live locks in this key's shard)",
                    self.budget.locks
                ),
            ));
        }
        let lock = LockState {
            token: token.to_owned(),
            fingerprint: fingerprint.to_owned(),
            completed: false,
            response: None,
        };
        let expires_at = now.saturating_add(super::micros(ttl));
        shard.insert(
            hash,
            key,
            Entry::new(State::Lock(Box::new(lock)), expires_at),
        );
        Ok(LockReply::Acquired)
    }

    pub(super) fn lock_release(&self, key: &str, token: &str) -> bool {
        let hash = self.shards.hash(key);
        let mut shard = self.shards.lock_one(hash);
        let now = self.clock.now_us();
        let holds = matches!(
            shard.live(hash, key, now),
            Some(Entry { state: State::Lock(lock), .. }) if lock.token == token
        );
        if holds {
            shard.remove(hash, key);
        }
        holds
    }

    /// Completes the lock `token` holds, storing `response`; false if it holds none. A
    /// response that does not fit the shard's response budget is refused.
    pub(super) fn lock_complete(
        &self,
        key: &str,
        token: &str,
        response: &[u8],
        keep_for: Duration,
    ) -> Result<bool, StoreError> {
        let hash = self.shards.hash(key);
        let mut shard = self.shards.lock_one(hash);
        let now = self.clock.now_us();
        if shard.usage().response_bytes + response.len() > self.budget.response_bytes
            && shard.sweep_due(now)
        {
            // Expired responses count until swept: swept now (once a second at most).
            shard.purge(now, &[]);
        }
        let room = self
            .budget
            .response_bytes
            .saturating_sub(shard.usage().response_bytes);
        match shard.live(hash, key, now) {
            Some(Entry {
                state: State::Lock(lock),
                expires_at,
                ..
            }) if lock.token == token && !lock.completed => {
                if response.len() > room {
                    return Err(StoreError::new(
                        StoreErrorKind::Capacity,
                        format!(
                            "the stored-response budget is full ({} bytes in this key's shard)",
                            self.budget.response_bytes
                        ),
                    ));
                }
                lock.completed = true;
                lock.response = Some(response.to_vec());
                *expires_at = now.saturating_add(super::micros(keep_for));
            }
            // The same outcome, told again (a call sent twice): it stands.
            Some(Entry {
                state: State::Lock(lock),
                ..
            }) if lock.token == token && lock.response.as_deref() == Some(response) => {
                return Ok(true);
            }
            _ => return Ok(false),
        }
        shard.add_response_bytes(response.len() as isize);
        Ok(true)
    }
}

impl LockState {
    pub(super) fn response_bytes(&self) -> usize {
        self.response.as_ref().map_or(0, Vec::len)
    }
}
