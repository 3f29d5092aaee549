//! A counting global allocator: the bytes live at the peak and the allocations made while one
//! piece of work runs. The fuzz targets that bound one input's memory (`review`, `mutate_yaml`)
//! check their bound with it (libFuzzer's own `-malloc_limit_mb` needs a sanitizer's allocator
//! hooks, which `--sanitizer none` builds do not have); tests/review_cost.rs measures the cost
//! per container with it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            PEAK.fetch_max(LIVE.fetch_add(layout.size(), Relaxed) + layout.size(), Relaxed);
            ALLOCS.fetch_add(1, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

/// Runs `f` and returns what it returned, the bytes it held live at its peak above what was
/// live before it, and the allocations it made (one thread allocating at a time).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    let before = LIVE.load(Relaxed);
    PEAK.store(before, Relaxed);
    ALLOCS.store(0, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed) - before, ALLOCS.load(Relaxed))
}

/// Runs `f` on `data` and panics (a crash libFuzzer keeps) when it held more than `limit` bytes
/// live above what was live before it.
pub fn bounded(what: &str, limit: usize, data: &[u8], f: impl FnOnce(&[u8])) {
    let ((), peak, _) = measure(|| f(data));
    assert!(peak <= limit, "{what}: one {}-byte input held {peak} bytes live at its peak (bound {limit})", data.len());
}
