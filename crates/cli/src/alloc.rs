//! The process allocator: glibc's malloc for the one-shot commands, mimalloc for the server.
//!
//! Why two. `riptide serve` builds and drops small allocations per frame on several threads for
//! as long as it runs (proof trees, decoded frames, event buffers, memtable entries). In steady
//! state, under glibc, `_int_malloc`, `unlink_chunk` and `malloc_consolidate` showed up on every
//! thread, 5.1% of the server's samples. With mimalloc, verified ingest from a local relay
//! took 1–4 CPU-µs less per event and ran 3.5% faster (median of ten alternated pairs,
//! `bench/results/2026-11-22-vm/serve-6.md`). The one-shot commands are the other way round:
//! `repo verify` holds one large working set, and mimalloc keeps freed memory for a while
//! (a purge delay) and grows a vector by copying where glibc remaps it in place. Its peak RSS
//! on the 72 MB generated repository went from 1.32× to 1.69× the CAR, past that command's
//! 1.5× target. So the allocator is chosen per command.
//!
//! How. [`use_mimalloc`] is called once at the start of `main`, before any thread starts, for
//! the commands that run the server. From then on new allocations come from mimalloc.
//! Allocations made before it (argument parsing) stay glibc's. Every free and realloc asks
//! mimalloc whether it owns the pointer (`mi_is_in_heap_region`, a lookup in its page map) and
//! goes to the allocator that made it. Before the switch nothing is mimalloc's, so the one-shot
//! commands never call mimalloc at all. The price is a second page-map lookup per free in the
//! server (mimalloc's own free does one too); against mimalloc as the only allocator it did not
//! show above the noise of three alternated pairs.

#![allow(unsafe_code)] // `GlobalAlloc` is an unsafe trait; each block says why it holds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

use mimalloc::MiMalloc;

/// The `#[global_allocator]`: see the module docs.
pub struct Process;

static MIMALLOC: AtomicBool = AtomicBool::new(false);

/// Makes mimalloc the allocator of every allocation from now on. Call it before starting
/// threads (it is correct at any time, since frees route by owner, but the point is that the
/// server's threads allocate from mimalloc from their first allocation on).
pub fn use_mimalloc() {
    MIMALLOC.store(true, Ordering::Release);
}

#[inline]
fn mimalloc_on() -> bool {
    MIMALLOC.load(Ordering::Acquire)
}

/// Whether `ptr` was allocated by mimalloc. Nothing was before [`use_mimalloc`].
#[inline]
fn owned_by_mimalloc(ptr: *mut u8) -> bool {
    // SAFETY: `mi_is_in_heap_region` only looks the address up in mimalloc's page map; it
    // accepts any pointer, including ones mimalloc never handed out.
    mimalloc_on() && unsafe { libmimalloc_sys::mi_is_in_heap_region(ptr.cast()) }
}

// SAFETY: every block is freed or resized by the allocator that made it (`owned_by_mimalloc`
// tells them apart: a pointer from glibc is never inside mimalloc's regions), and both
// allocators honour the `GlobalAlloc` contract for the layouts passed through unchanged.
unsafe impl GlobalAlloc for Process {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract (a non-zero size) is passed on unchanged.
        unsafe {
            if mimalloc_on() {
                MiMalloc.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if mimalloc_on() {
                MiMalloc.alloc_zeroed(layout)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated with `layout` by this allocator, hence by the one that
        // owns it.
        unsafe {
            if owned_by_mimalloc(ptr) {
                MiMalloc.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`; a block stays with the allocator that made it.
        unsafe {
            if owned_by_mimalloc(ptr) {
                MiMalloc.realloc(ptr, layout, new_size)
            } else {
                System.realloc(ptr, layout, new_size)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size class, from glibc before the switch and from mimalloc after it, each
    /// grown, shrunk, read back and freed through the allocator that made it.
    #[test]
    fn blocks_go_back_to_their_allocator() {
        fn fill(n: usize, seed: u8) -> Vec<u8> {
            (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
        }
        let sizes = [1usize, 24, 4096, 200_000, 3 << 20];
        let before: Vec<Vec<u8>> = sizes.iter().map(|&n| fill(n, 1)).collect();
        let was_on = mimalloc_on();
        use_mimalloc();
        // The test binary's global allocator is `Process` (main.rs): whatever the other tests
        // allocated so far may be glibc's; these two sets are certainly one of each.
        if !was_on {
            for v in &before {
                assert!(!owned_by_mimalloc(v.as_ptr().cast_mut()), "glibc block");
            }
        }
        let after: Vec<Vec<u8>> = sizes.iter().map(|&n| fill(n, 2)).collect();
        for v in &after {
            assert!(owned_by_mimalloc(v.as_ptr().cast_mut()), "mimalloc block");
        }
        for (mut v, seed) in before
            .into_iter()
            .zip(std::iter::repeat(1))
            .chain(after.into_iter().zip(std::iter::repeat(2)))
        {
            let n = v.len();
            v.extend_from_slice(&fill(n + 17, seed)); // realloc up
            assert_eq!(v[..n], fill(n, seed)[..]);
            v.truncate(n / 2 + 1);
            v.shrink_to_fit(); // realloc down
            assert_eq!(v[..], fill(n, seed)[..n / 2 + 1]);
        }
        let zeroed = vec![0u64; 1 << 18];
        assert!(zeroed.iter().all(|&x| x == 0));
    }
}
