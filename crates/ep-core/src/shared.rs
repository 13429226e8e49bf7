//! Constants shared between sessions by content: two sessions of one model in a process hold
//! one MLX copy of each weight. Entries are weak: the copy lives as long as a plan uses it.

use crate::Result;
use crate::mlx::{Array, Dtype};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use xxhash_rust::xxh3::xxh3_64;

/// A table of live constants by content.
#[derive(Default)]
pub struct SharedConstants {
    by_hash: Mutex<HashMap<u64, Vec<Weak<Array>>>>,
    /// Constants copied into MLX.
    pub uploads: AtomicU64,
    /// Constants served by an existing copy.
    pub reuses: AtomicU64,
    /// Bytes not copied thanks to reuse.
    pub bytes_saved: AtomicU64,
}

impl SharedConstants {
    /// The process-wide table.
    pub fn global() -> &'static SharedConstants {
        static GLOBAL: OnceLock<SharedConstants> = OnceLock::new();
        GLOBAL.get_or_init(SharedConstants::default)
    }

    /// An MLX array holding `bytes` (row-major `dtype`, `shape`): an existing one with the
    /// same content when a live plan holds it, else a new copy.
    pub fn get(&self, bytes: &[u8], shape: &[i64], dtype: Dtype) -> Result<Arc<Array>> {
        let hash = xxh3_64(bytes) ^ (dtype as u64).rotate_left(56) ^ xxh3_64(format!("{shape:?}").as_bytes());
        let mut table = self.by_hash.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = table.entry(hash).or_default();
        bucket.retain(|w| w.strong_count() > 0);
        for candidate in bucket.iter().filter_map(Weak::upgrade) {
            if candidate.dtype() == dtype && candidate.shape() == shape && candidate.host_bytes() == Some(bytes) {
                self.reuses.fetch_add(1, Ordering::Relaxed);
                self.bytes_saved.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                return Ok(candidate);
            }
        }
        let array = Arc::new(Array::from_bytes(bytes, shape, dtype)?);
        bucket.push(Arc::downgrade(&array));
        self.uploads.fetch_add(1, Ordering::Relaxed);
        Ok(array)
    }

    /// Live entries (constants some plan still holds).
    pub fn live(&self) -> usize {
        let table = self.by_hash.lock().unwrap_or_else(|p| p.into_inner());
        table.values().flatten().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx;

    fn bytes_of(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn equal_content_is_one_copy() {
        let _g = mlx::lock();
        let table = SharedConstants::default();
        let w = bytes_of(&[1.0; 1024]);
        let before = mlx::active_memory().unwrap();
        let a = table.get(&w, &[32, 32], Dtype::F32).unwrap();
        let b = table.get(&w, &[32, 32], Dtype::F32).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(mlx::active_memory().unwrap() - before, 4096, "one buffer for both");
        assert_eq!((table.uploads.load(Ordering::Relaxed), table.reuses.load(Ordering::Relaxed)), (1, 1));
        assert_eq!(table.bytes_saved.load(Ordering::Relaxed), 4096);
    }

    #[test]
    fn different_content_shape_or_dtype_is_another_copy() {
        let _g = mlx::lock();
        let table = SharedConstants::default();
        let w = bytes_of(&[1.0, 2.0, 3.0, 4.0]);
        let mut v = w.clone();
        v[0] ^= 1;
        let a = table.get(&w, &[4], Dtype::F32).unwrap();
        assert!(!Arc::ptr_eq(&a, &table.get(&v, &[4], Dtype::F32).unwrap()));
        assert!(!Arc::ptr_eq(&a, &table.get(&w, &[2, 2], Dtype::F32).unwrap()));
        assert!(!Arc::ptr_eq(&a, &table.get(&w, &[4], Dtype::I32).unwrap()));
        assert_eq!(table.uploads.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_constant_no_plan_holds_is_released() {
        let _g = mlx::lock();
        let table = SharedConstants::default();
        let w = bytes_of(&[5.0; 16]);
        drop(table.get(&w, &[16], Dtype::F32).unwrap());
        assert_eq!(table.live(), 0);
        drop(table.get(&w, &[16], Dtype::F32).unwrap());
        assert_eq!(table.uploads.load(Ordering::Relaxed), 2, "nothing kept it alive in between");
    }
}
