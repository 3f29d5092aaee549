//! What the examples share (not an example itself: Cargo builds `examples/*.rs` and
//! `examples/*/main.rs` only). Each example takes it with `mod common;`.

/// The value after `name` in `args` (`--count 1000`), or `default` when `name` is absent.
/// Panics, naming the flag, when the value does not parse.
pub fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} expects a number, got {v:?}")))
        .unwrap_or(default)
}

/// mimalloc (the binary's allocator) counting the bytes currently allocated (requested sizes:
/// the allocator's own overhead is not included). An example that measures memory installs it
/// with `#[global_allocator] static GLOBAL: common::Counting = common::Counting;`.
#[allow(dead_code)] // not every example counts
pub struct Counting;

static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

/// The bytes allocated through [`Counting`] and not yet freed.
#[allow(dead_code)]
pub fn live_bytes() -> isize {
    LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

// SAFETY: every call is forwarded unchanged to mimalloc; the counter is only bookkeeping.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}
