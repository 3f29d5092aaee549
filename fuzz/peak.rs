//! A counting global allocator for the fuzz targets that bound one input's memory (`review`,
//! `mutate_yaml`): the bytes live at the peak while one input runs, checked against the
//! target's bound after it. libFuzzer's own `-malloc_limit_mb` needs a sanitizer's allocator
//! hooks, which `--sanitizer none` builds do not have.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            PEAK.fetch_max(LIVE.fetch_add(layout.size(), Relaxed) + layout.size(), Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

/// Runs `f` and panics (a crash libFuzzer keeps) when it held more than `limit` bytes live
/// above what was live before it.
pub fn bounded(what: &str, limit: usize, data: &[u8], f: impl FnOnce(&[u8])) {
    let before = LIVE.load(Relaxed);
    PEAK.store(before, Relaxed);
    f(data);
    let peak = PEAK.load(Relaxed) - before;
    assert!(peak <= limit, "{what}: one {}-byte input held {peak} bytes live at its peak (bound {limit})", data.len());
}
