//! The sharded map: each key hashed once, found by its hash, compared whole (invariant 7).
//!
//! A shard keeps its entries in a slab (`slots`) and a hash table of slot indices, so that a
//! full shard can sample random entries and evict the least recently used one. It counts what
//! it holds of each kind (counters, bans, locks, stored response bytes), so that each kind is
//! held to its own budget and no kind can crowd out another.

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

/// The kinds of entry, each with its own budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Counter,
    Ban,
    Lock,
}

impl State {
    pub(super) fn kind(&self) -> Kind {
        match self {
            State::Rules(_) => Kind::Counter,
            State::Ban(_) => Kind::Ban,
            State::Lock(_) => Kind::Lock,
        }
    }

    /// The bytes of a stored response it holds.
    fn response_bytes(&self) -> usize {
        match self {
            State::Lock(lock) => lock.response_bytes(),
            _ => 0,
        }
    }
}

/// What a shard holds, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Usage {
    pub(super) counters: usize,
    pub(super) bans: usize,
    pub(super) locks: usize,
    pub(super) response_bytes: usize,
}

impl Usage {
    pub(super) fn of(&self, kind: Kind) -> usize {
        match kind {
            Kind::Counter => self.counters,
            Kind::Ban => self.bans,
            Kind::Lock => self.locks,
        }
    }

    fn count(&mut self, state: &State, added: bool) {
        let count = match state.kind() {
            Kind::Counter => &mut self.counters,
            Kind::Ban => &mut self.bans,
            Kind::Lock => &mut self.locks,
        };
        let bytes = state.response_bytes();
        if added {
            *count += 1;
            self.response_bytes += bytes;
        } else {
            *count -= 1;
            self.response_bytes -= bytes;
        }
    }
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

    /// How much eviction spares this entry, lowest first, and among equals which goes first
    /// (lowest first): expired entries; then counters within their limits, least recently used
    /// first, then counters over their limits; a ban that has ended (kept only to remember its
    /// strikes), the longest ended first; live bans and locks never (a flood of new bans must
    /// not lift the ones in force, nor may remembered strikes keep new bans out).
    fn keep_rank(&self, now: u64, age: u32) -> Option<(u8, u64)> {
        if self.expires_at <= now {
            return Some((0, 0));
        }
        match self.state {
            State::Rules(_) => Some((1 + u8::from(self.limited), u64::from(u32::MAX - age))),
            State::Ban(ref ban) if ban.until() <= now => Some((1, ban.until())),
            State::Ban(_) | State::Lock(_) => None,
        }
    }
}

/// An entry evicted to make room, with the hash of its key.
pub(super) struct Evicted {
    pub(super) hash: u64,
    pub(super) entry: Entry,
}

struct Slot {
    /// Text (bans, locks, limiter keys of a text request) or a limiter's compact key.
    key: SlotKey,
    /// `None` while the slot is free.
    entry: Option<Entry>,
}

/// A slot's key: in the slot while short (a compact key of an IPv4 client is 15 bytes), so
/// that a look-up compares it where the entry is, not behind a pointer in a cache line of its
/// own; else on the heap.
enum SlotKey {
    Inline {
        len: u8,
        bytes: [u8; SlotKey::INLINE],
    },
    Heap(Box<[u8]>),
}

impl SlotKey {
    /// The longest key held in the slot: with its length and the enum's tag, 24 bytes, 8 more
    /// than a boxed key, which would take an allocation of its own besides.
    const INLINE: usize = 22;

    fn new(key: &[u8]) -> SlotKey {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= SlotKey::INLINE => {
                let mut bytes = [0; SlotKey::INLINE];
                bytes[..key.len()].copy_from_slice(key);
                SlotKey::Inline { len, bytes }
            }
            _ => SlotKey::Heap(key.into()),
        }
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        match self {
            SlotKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            SlotKey::Heap(key) => key,
        }
    }

    /// The key of a free slot.
    const EMPTY: SlotKey = SlotKey::Inline {
        len: 0,
        bytes: [0; SlotKey::INLINE],
    };
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
    usage: Usage,
    /// Evicted limiter keys that were at their limits: the hash of each key and the instant
    /// (µs) until which it stays denied (see `owe`).
    owed: HashTable<(u64, u64)>,
    /// When a full budget last swept the shard (µs).
    swept_at: u64,
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
            usage: Usage::default(),
            owed: HashTable::new(),
            swept_at: 0,
        }
    }

    /// Whether a full budget may sweep the shard now: once a second at most, so that a budget
    /// kept full of live entries costs one sweep a second, not one per request.
    pub(super) fn sweep_due(&mut self, now: u64) -> bool {
        if now < self.swept_at.saturating_add(1_000_000) {
            return false;
        }
        self.swept_at = now;
        true
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    pub(super) fn usage(&self) -> Usage {
        self.usage
    }

    /// A stored response of `bytes` was added to (or, negative, taken from) an entry in place.
    pub(super) fn add_response_bytes(&mut self, bytes: isize) {
        self.usage.response_bytes = self.usage.response_bytes.saturating_add_signed(bytes);
    }

    /// Remembers that the limiter key of `hash` was evicted at its limit and must stay denied
    /// until `until`, holding at most `cap` such records: past it, the record nearest its end
    /// among a few sampled goes first (one that has ended, if sampled: ended records are
    /// otherwise left to the sweeper, so that a full table costs each new record a few looks,
    /// not a pass over all of them).
    pub(super) fn owe(&mut self, hash: u64, until: u64, cap: usize) {
        if let Some((_, at)) = self.owed.find_mut(hash, |&(h, _)| h == hash) {
            *at = (*at).max(until);
            return;
        }
        if self.owed.len() >= cap {
            let nearest = self
                .owed
                .iter()
                .take(16)
                .min_by_key(|&&(_, at)| at)
                .copied();
            if let Some((h, _)) = nearest {
                if let Ok(found) = self.owed.find_entry(h, |&(k, _)| k == h) {
                    found.remove();
                }
            }
        }
        self.owed.insert_unique(hash, (hash, until), |&(h, _)| h);
    }

    /// Forgets what the evicted limiter key of `hash` owed (its counters were reset).
    pub(super) fn forgive(&mut self, hash: u64) {
        if let Ok(found) = self.owed.find_entry(hash, |&(h, _)| h == hash) {
            found.remove();
        }
    }

    /// Until when the evicted limiter key of `hash` stays denied, if it was evicted at its
    /// limit and that time has not come (a record that ended is dropped).
    pub(super) fn owed(&mut self, hash: u64, now: u64) -> Option<u64> {
        if self.owed.is_empty() {
            return None;
        }
        let found = self.owed.find_entry(hash, |&(h, _)| h == hash).ok()?;
        let until = found.get().1;
        if until > now {
            return Some(until);
        }
        found.remove();
        None
    }

    /// The slot holding `key`.
    #[inline]
    pub(super) fn find(&self, hash: u64, key: &(impl AsRef<[u8]> + ?Sized)) -> Option<SlotId> {
        let (slots, key) = (&self.slots, key.as_ref());
        self.table
            .find(hash, |&i| slots[i as usize].key.bytes() == key)
            .copied()
    }

    /// Marks the entry in `id` as used now, and returns it.
    #[inline]
    pub(super) fn touch(&mut self, id: SlotId) -> &mut Entry {
        self.tick = self.tick.wrapping_add(1);
        let tick = self.tick;
        let entry = self.entry(id);
        entry.used = tick;
        entry
    }

    pub(super) fn entry(&mut self, id: SlotId) -> &mut Entry {
        self.slots[id as usize]
            .entry
            .as_mut()
            .expect("a slot id names an occupied slot")
    }

    /// The entry under `key`, expired or not.
    pub(super) fn get_mut(
        &mut self,
        hash: u64,
        key: &(impl AsRef<[u8]> + ?Sized),
    ) -> Option<&mut Entry> {
        let id = self.find(hash, key)?;
        Some(self.entry(id))
    }

    /// The entry under `key` if it has not expired.
    pub(super) fn live(
        &mut self,
        hash: u64,
        key: &(impl AsRef<[u8]> + ?Sized),
        now: u64,
    ) -> Option<&mut Entry> {
        self.get_mut(hash, key).filter(|e| e.expires_at > now)
    }

    /// Puts `entry` under `key`, replacing what was there.
    pub(super) fn insert(
        &mut self,
        hash: u64,
        key: &(impl AsRef<[u8]> + ?Sized),
        mut entry: Entry,
    ) -> SlotId {
        self.tick = self.tick.wrapping_add(1);
        entry.used = self.tick;
        self.usage.count(&entry.state, true);
        if let Some(id) = self.find(hash, key) {
            let old = std::mem::replace(self.entry(id), entry);
            self.usage.count(&old.state, false);
            return id;
        }
        let slot = Slot {
            key: SlotKey::new(key.as_ref()),
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
        self.table.insert_unique(hash, id, |&i| {
            hasher.hash_one(slots[i as usize].key.bytes())
        });
        id
    }

    /// Removes the entry under `key`.
    pub(super) fn remove(&mut self, hash: u64, key: &(impl AsRef<[u8]> + ?Sized)) -> Option<Entry> {
        let (slots, key) = (&self.slots, key.as_ref());
        let found = self
            .table
            .find_entry(hash, |&i| slots[i as usize].key.bytes() == key);
        let (id, _) = found.ok()?.remove();
        self.release(id)
    }

    fn release(&mut self, id: SlotId) -> Option<Entry> {
        let slot = &mut self.slots[id as usize];
        slot.key = SlotKey::EMPTY;
        let entry = slot.entry.take();
        if let Some(entry) = &entry {
            self.usage.count(&entry.state, false);
        }
        self.free.push(id);
        entry
    }

    /// Drops every expired entry but those in `keep`.
    pub(super) fn purge(&mut self, now: u64, keep: &[SlotId]) {
        let Shard {
            table,
            slots,
            free,
            usage,
            owed,
            ..
        } = self;
        table.retain(|&mut id| {
            let slot = &mut slots[id as usize];
            let live = slot.entry.as_ref().is_some_and(|e| e.expires_at > now);
            let keep = live || keep.contains(&id);
            if !keep {
                slot.key = SlotKey::EMPTY;
                if let Some(entry) = slot.entry.take() {
                    usage.count(&entry.state, false);
                }
                free.push(id);
            }
            keep
        });
        owed.retain(|&mut (_, until)| until > now);
        if self.table.is_empty() {
            // Nothing left: give the slab's memory back.
            self.slots = Vec::new();
            self.free = Vec::new();
        }
    }

    /// Evicts one entry of `kind` to make room, the one eviction spares least (see
    /// `Entry::keep_rank`), chosen among a few sampled at random (limiter keys from the whole
    /// shard when the sample holds none); never a live ban or lock, or one of `keep`. `None`
    /// if nothing can go.
    pub(super) fn evict_one(&mut self, kind: Kind, now: u64, keep: &[SlotId]) -> Option<Evicted> {
        const SAMPLES: usize = 16;
        if self.slots.is_empty() || self.usage.of(kind) == 0 {
            return None;
        }
        let tick = self.tick;
        let rank = |id: SlotId, slot: &Slot| -> Option<(u8, u64)> {
            let entry = slot.entry.as_ref()?;
            if entry.state.kind() != kind || keep.contains(&id) {
                return None;
            }
            // Ages, not ticks, so that wrapping counts right.
            entry.keep_rank(now, tick.wrapping_sub(entry.used))
        };
        let mut best: Option<((u8, u64), SlotId)> = None;
        for _ in 0..SAMPLES * 2 {
            let id = (self.next_random() % self.slots.len() as u64) as SlotId;
            let Some(r) = rank(id, &self.slots[id as usize]) else {
                continue;
            };
            if best.is_none_or(|(b, _)| r < b) {
                best = Some((r, id));
            }
            if r.0 == 0 {
                break;
            }
        }
        if best.is_none() && kind == Kind::Counter {
            best = (0..self.slots.len() as SlotId)
                .filter_map(|id| Some((rank(id, &self.slots[id as usize])?, id)))
                .min();
        }
        let (_, id) = best?;
        let hash = self.hasher.hash_one(self.slots[id as usize].key.bytes());
        if let Ok(found) = self.table.find_entry(hash, |&i| i == id) {
            found.remove();
        }
        let entry = self.release(id)?;
        Some(Evicted { hash, entry })
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
    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.table.iter().filter_map(|&id| {
            let slot = &self.slots[id as usize];
            slot.entry.as_ref().map(|e| (slot.key.bytes(), e))
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

    /// The hash of a key, as text or bytes (a key is hashed as its bytes, whatever its type).
    pub(super) fn hash(&self, key: &(impl AsRef<[u8]> + ?Sized)) -> u64 {
        self.hasher.hash_one(key.as_ref())
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
        // Two keys (two limiters, or one and a ban key): two shards at most, without the
        // vectors of the general case.
        if let &[a, b] = hashes {
            let (a, b) = (self.shard_of(a), self.shard_of(b));
            if a == b {
                return Locked::One(self.shards[a].0.lock());
            }
            let (low, high) = (a.min(b), a.max(b));
            let low_guard = self.shards[low].0.lock();
            return Locked::Two {
                shards: self,
                low,
                guards: [low_guard, self.shards[high].0.lock()],
            };
        }
        // Sorted without repeats by insertion: a check holds a handful of keys, and the
        // general sort and collects cost more than the locks.
        let mut order = SmallVec::<[usize; 8]>::new();
        for &hash in hashes {
            let shard = self.shard_of(hash);
            if order.contains(&shard) {
                continue;
            }
            order.push(shard);
            let mut at = order.len() - 1;
            while at > 0 && order[at - 1] > shard {
                order.swap(at - 1, at);
                at -= 1;
            }
        }
        if order.len() <= 1 {
            return Locked::One(self.shards[order.first().copied().unwrap_or(0)].0.lock());
        }
        let mut guards = SmallVec::new();
        for &i in &order {
            guards.push(self.shards[i].0.lock());
        }
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
    /// Two shards: the lower-numbered one's guard first.
    Two {
        shards: &'a Shards,
        low: usize,
        guards: [MutexGuard<'a, Shard>; 2],
    },
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
            Locked::Two {
                shards,
                low,
                guards,
            } => &mut guards[usize::from(shards.shard_of(hash) != *low)],
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of every length around the inline limit are kept whole, in the slot or on the
    /// heap, and each is found as itself only: not as a key it is a prefix of, nor one padded
    /// with zeros.
    #[test]
    fn keys_in_and_out_of_the_slot_are_found_whole() {
        let mut shard = Shard::new(Hasher::default());
        let keys: Vec<Vec<u8>> = (1..=2 * SlotKey::INLINE)
            .flat_map(|n| [vec![0xffu8; n], vec![0u8; n]])
            .collect();
        let hash = |k: &[u8]| shard.hasher.hash_one(k);
        let hashes: Vec<u64> = keys.iter().map(|k| hash(k)).collect();
        for (i, (key, &h)) in keys.iter().zip(&hashes).enumerate() {
            let entry = Entry::new(State::Rules(RuleStates::default()), i as u64);
            let id = shard.insert(h, key, entry);
            assert_eq!(shard.slots[id as usize].key.bytes(), &key[..]);
            let inline = matches!(shard.slots[id as usize].key, SlotKey::Inline { .. });
            assert_eq!(inline, key.len() <= SlotKey::INLINE, "{} bytes", key.len());
        }
        for (i, (key, &h)) in keys.iter().zip(&hashes).enumerate() {
            let found = shard.get_mut(h, key).expect("every key is found");
            assert_eq!(found.expires_at, i as u64, "{} bytes", key.len());
        }
        assert_eq!(shard.len(), keys.len());
    }

    /// Two keys in two shards, locked together in either order, are each written to and
    /// found in their own shard; two keys of one shard take its one lock.
    #[test]
    fn two_keys_are_locked_in_their_own_shards() {
        let shards = Shards::new(8);
        let keys: Vec<String> = (0..256).map(|i| format!("key-{i}")).collect();
        let shard_of = |k: &String| shards.shard_of(shards.hash(k));
        let a = &keys[0];
        let b = keys.iter().find(|k| shard_of(k) != shard_of(a)).unwrap();
        let c = keys[1..]
            .iter()
            .find(|k| shard_of(k) == shard_of(a))
            .unwrap();
        let hash = |k: &String| shards.hash(k);
        for (first, second) in [(a, b), (b, a)] {
            let mut locked = shards.lock(&[hash(first), hash(second)]);
            assert!(matches!(locked, Locked::Two { .. }));
            for k in [first, second] {
                let entry = Entry::new(State::Rules(RuleStates::default()), u64::MAX);
                locked.shard(hash(k)).insert(hash(k), k, entry);
            }
            drop(locked);
            for k in [first, second] {
                assert!(shards.lock_one(hash(k)).find(hash(k), k).is_some(), "{k}");
                shards.lock_one(hash(k)).remove(hash(k), k);
            }
        }
        assert!(matches!(shards.lock(&[hash(a), hash(c)]), Locked::One(_)));
    }
}
