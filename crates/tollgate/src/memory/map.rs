//! The sharded map: each key hashed once, found by its hash, compared whole (invariant 7).
//!
//! A shard keeps its entries in a slab (`slots`) and a hash table of slot indices, so that a
//! full shard can sample random entries and evict the least recently used one.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use super::{bans::BanState, locks::LockState, rules::RuleStates};

pub(super) type Hasher = foldhash::fast::RandomState;

/// What one key holds.
pub(super) enum State {
    Rules(RuleStates),
    Ban(BanState),
    Lock(Box<LockState>),
}

pub(super) struct Entry {
    pub(super) state: State,
    /// The instant (µs) after which the entry holds nothing that counts.
    pub(super) expires_at: u64,
    /// When a check last touched it, in its shard's ticks (wrapping): what eviction goes by.
    used: u32,
    /// The last check of this limiter key was denied or used up a rule: it is evicted last.
    pub(super) limited: bool,
}

impl Entry {
    pub(super) fn new(state: State, expires_at: u64) -> Entry {
        Entry {
            state,
            expires_at,
            used: 0,
            limited: false,
        }
    }

    /// How much eviction spares this entry: expired first, then live keys within their
    /// limits, then keys over their limits; bans and duplicate-guard locks never.
    fn keep_rank(&self, now: u64) -> Option<u8> {
        if self.expires_at <= now {
            return Some(0);
        }
        match self.state {
            State::Rules(_) => Some(1 + u8::from(self.limited)),
            State::Ban(_) | State::Lock(_) => None,
        }
    }
}

struct Slot {
    key: Box<str>,
    /// `None` while the slot is free.
    entry: Option<Entry>,
}

/// One shard: a slab of entries and a table of their indices. A slot keeps no hash (8 bytes
/// a key): the rare growth of the table hashes the keys again.
pub(super) struct Shard {
    hasher: Hasher,
    table: HashTable<u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// State of the sampling generator (xorshift).
    sample: u64,
    /// Counts touches: the recency of entries.
    tick: u32,
}

/// Where an entry lives in its shard; valid while the shard stays locked and the entry is not
/// removed.
pub(super) type SlotId = u32;

impl Shard {
    fn new(hasher: Hasher) -> Shard {
        Shard {
            hasher,
            table: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            sample: 0,
            tick: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// The slot holding `key`.
    pub(super) fn find(&self, hash: u64, key: &str) -> Option<SlotId> {
        let slots = &self.slots;
        self.table
            .find(hash, |&i| *slots[i as usize].key == *key)
            .copied()
    }

    /// Marks the entry in `id` as used now.
    pub(super) fn touch(&mut self, id: SlotId) {
        self.tick = self.tick.wrapping_add(1);
        let tick = self.tick;
        self.entry(id).used = tick;
    }

    pub(super) fn entry(&mut self, id: SlotId) -> &mut Entry {
        self.slots[id as usize]
            .entry
            .as_mut()
            .expect("a slot id names an occupied slot")
    }

    /// The entry under `key`, expired or not.
    pub(super) fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        let id = self.find(hash, key)?;
        Some(self.entry(id))
    }

    /// The entry under `key` if it has not expired.
    pub(super) fn live(&mut self, hash: u64, key: &str, now: u64) -> Option<&mut Entry> {
        self.get_mut(hash, key).filter(|e| e.expires_at > now)
    }

    /// Puts `entry` under `key`, replacing what was there.
    pub(super) fn insert(&mut self, hash: u64, key: &str, mut entry: Entry) -> SlotId {
        self.tick = self.tick.wrapping_add(1);
        entry.used = self.tick;
        if let Some(id) = self.find(hash, key) {
            *self.entry(id) = entry;
            return id;
        }
        let slot = Slot {
            key: key.into(),
            entry: Some(entry),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as SlotId
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.table
            .insert_unique(hash, id, |&i| hasher.hash_one(&*slots[i as usize].key));
        id
    }

    /// Removes the entry under `key`.
    pub(super) fn remove(&mut self, hash: u64, key: &str) -> Option<Entry> {
        let slots = &self.slots;
        let found = self
            .table
            .find_entry(hash, |&i| *slots[i as usize].key == *key);
        let (id, _) = found.ok()?.remove();
        self.release(id)
    }

    fn release(&mut self, id: SlotId) -> Option<Entry> {
        let slot = &mut self.slots[id as usize];
        slot.key = Box::default();
        let entry = slot.entry.take();
        self.free.push(id);
        entry
    }

    /// Drops every expired entry but those in `keep`.
    pub(super) fn purge(&mut self, now: u64, keep: &[SlotId]) {
        let Shard {
            table, slots, free, ..
        } = self;
        table.retain(|&mut id| {
            let slot = &mut slots[id as usize];
            let live = slot.entry.as_ref().is_some_and(|e| e.expires_at > now);
            let keep = live || keep.contains(&id);
            if !keep {
                slot.key = Box::default();
                slot.entry = None;
                free.push(id);
            }
            keep
        });
        if self.table.is_empty() {
            // Nothing left: give the slab's memory back.
            self.slots = Vec::new();
            self.free = Vec::new();
        }
    }

    /// Evicts one entry to make room, sampling a few at random: an expired one if found, else
    /// the least recently used within its limits, else the least recently used over its
    /// limits; never a ban, a lock, or one of `keep`. False if the sample found nothing to
    /// evict.
    pub(super) fn evict_one(&mut self, now: u64, keep: &[SlotId]) -> bool {
        const SAMPLES: usize = 16;
        if self.slots.is_empty() {
            return false;
        }
        let mut best: Option<(u8, u32, SlotId)> = None;
        for _ in 0..SAMPLES * 2 {
            let id = (self.next_random() % self.slots.len() as u64) as SlotId;
            let slot = &self.slots[id as usize];
            let Some(entry) = &slot.entry else { continue };
            if keep.contains(&id) {
                continue;
            }
            let Some(rank) = entry.keep_rank(now) else {
                continue;
            };
            // Ages, not ticks, so that wrapping counts right.
            let age = self.tick.wrapping_sub(entry.used);
            if best.is_none_or(|(r, oldest, _)| (rank, u32::MAX - age) < (r, u32::MAX - oldest)) {
                best = Some((rank, age, id));
            }
            if rank == 0 {
                break;
            }
        }
        let Some((_, _, id)) = best else {
            return false;
        };
        let hash = self.hasher.hash_one(&*self.slots[id as usize].key);
        if let Ok(found) = self.table.find_entry(hash, |&i| i == id) {
            found.remove();
        }
        self.release(id);
        true
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*: cheap, and good enough to pick slots.
        if self.sample == 0 {
            self.sample = rand::random::<u64>() | 1;
        }
        let mut x = self.sample;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.sample = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Every entry with its key.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.table.iter().filter_map(|&id| {
            let slot = &self.slots[id as usize];
            slot.entry.as_ref().map(|e| (&*slot.key, e))
        })
    }
}

/// The shards of a store and the hasher that places keys in them.
pub(super) struct Shards {
    shards: Box<[Padded]>,
    hasher: Hasher,
}

/// A shard on cache lines of its own: threads working in neighbouring shards do not take each
/// other's line (two 64-byte lines, as adjacent-line prefetchers pair them).
#[repr(align(128))]
struct Padded(Mutex<Shard>);

impl Shards {
    pub(super) fn new(count: usize) -> Shards {
        let hasher = Hasher::default();
        Shards {
            shards: (0..count.max(1))
                .map(|_| Padded(Mutex::new(Shard::new(hasher.clone()))))
                .collect(),
            hasher,
        }
    }

    pub(super) fn count(&self) -> usize {
        self.shards.len()
    }

    pub(super) fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key's hash. The table inside uses the hash's low bits (bucket) and top
    /// seven (tag), so the shard is taken from the middle.
    pub(super) fn shard_of(&self, hash: u64) -> usize {
        // Bits 24..56 as a fraction of the shard count: a multiply, not a division.
        let middle = (hash >> 24) & 0xffff_ffff;
        ((middle * self.shards.len() as u64) >> 32) as usize
    }

    pub(super) fn lock_one(&self, hash: u64) -> MutexGuard<'_, Shard> {
        self.shards[self.shard_of(hash)].0.lock()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Mutex<Shard>> {
        self.shards.iter().map(|s| &s.0)
    }

    /// Locks the shards of `hashes`, in ascending order so that no two checks wait on each
    /// other.
    pub(super) fn lock(&self, hashes: &[u64]) -> Locked<'_> {
        let first = hashes.first().map_or(0, |&h| self.shard_of(h));
        if hashes.iter().all(|&h| self.shard_of(h) == first) {
            return Locked::One(self.shards[first].0.lock());
        }
        let mut order: SmallVec<[usize; 8]> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| self.shards[i].0.lock()).collect();
        Locked::Many {
            shards: self,
            order,
            guards,
        }
    }
}

/// The shards one check holds.
pub(super) enum Locked<'a> {
    /// Every key of the check lives in one shard.
    One(MutexGuard<'a, Shard>),
    Many {
        shards: &'a Shards,
        order: SmallVec<[usize; 8]>,
        guards: SmallVec<[MutexGuard<'a, Shard>; 8]>,
    },
}

impl Locked<'_> {
    /// The locked shard of a key's hash.
    pub(super) fn shard(&mut self, hash: u64) -> &mut Shard {
        match self {
            Locked::One(guard) => guard,
            Locked::Many {
                shards,
                order,
                guards,
            } => {
                let index = order.binary_search(&shards.shard_of(hash)).unwrap_or(0);
                &mut guards[index]
            }
        }
    }
}
