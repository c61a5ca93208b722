//! [`BoundedMap`]: a map that forgets its oldest entries beyond a bound (adapters remember
//! recent platform ids, drafts and delivery progress without growing forever).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// A map that forgets the entries inserted longest ago once it holds more than its capacity.
/// Replacing the value of a present key does not make it younger.
#[derive(Debug)]
pub struct BoundedMap<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> BoundedMap<K, V> {
    /// An empty map keeping at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Insert or replace; a new key beyond the capacity evicts the oldest.
    pub fn insert(&mut self, k: K, v: V) {
        if self.map.insert(k.clone(), v).is_none() {
            self.order.push_back(k);
            while self.order.len() > self.capacity {
                if let Some(old) = self.order.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
    }

    /// The value under `k`, if remembered.
    pub fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k)
    }

    /// The value under `k`, mutably, if remembered.
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.map.get_mut(k)
    }

    /// Whether `k` is remembered.
    pub fn contains_key(&self, k: &K) -> bool {
        self.map.contains_key(k)
    }

    /// Forget `k`, returning its value.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        let v = self.map.remove(k);
        if v.is_some() {
            self.order.retain(|x| x != k);
        }
        v
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::BoundedMap;

    #[test]
    fn forgets_the_oldest_beyond_capacity_and_replacing_keeps_the_age() {
        let mut m = BoundedMap::new(2);
        m.insert("a", 1);
        m.insert("b", 2);
        m.insert("a", 10);
        m.insert("c", 3);
        assert_eq!(m.get(&"a"), None);
        assert_eq!(m.get(&"b"), Some(&2));
        assert_eq!(m.get(&"c"), Some(&3));
        assert_eq!(m.remove(&"b"), Some(2));
        m.insert("d", 4);
        assert_eq!(m.len(), 2);
        assert!(m.contains_key(&"c") && m.contains_key(&"d"));
    }
}
