//! Heap bytes by component in one process: the bench's allocator (mimalloc, as the
//! binary's) keeps, in a header before each block, which component's thread
//! allocated it, and counts live bytes and their peak per component. A thread
//! belongs to a component when its runtime's `on_thread_start` said so
//! ([`set_thread_component`]); every other thread (the lab: the fake API server, the
//! scheduler and kubelet, the node agents, the booking API, the bench itself) is
//! [`Component::Lab`].
//!
//! A block freed on another thread is subtracted from the component that allocated
//! it, so bytes a component hands over (a response body the lab's fake wrote, then
//! the controller drops) stay with whoever allocated them. What is counted is the
//! bytes asked for, not the allocator's pages: the peak live heap, which is most of
//! a process's RSS but not all of it (code, stacks, allocator slack).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

use mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Component {
    Lab = 0,
    Controller = 1,
    Webhook = 2,
}

const COMPONENTS: usize = 3;

thread_local! {
    // Const-initialised and without a destructor: safe to read inside the allocator.
    static COMPONENT: Cell<u8> = const { Cell::new(0) };
}

/// From now on this thread's allocations count for `component`.
pub fn set_thread_component(component: Component) {
    COMPONENT.with(|c| c.set(component as u8));
}

/// One cache line per counter, so that threads of different components do not
/// share one.
#[repr(align(64))]
struct Counter {
    live: AtomicI64,
    /// The highest live bytes since [`reset_peak`] (a phase's).
    peak: AtomicI64,
    /// The highest live bytes since the process started (the whole run's).
    top: AtomicI64,
}

const fn counter() -> Counter {
    Counter {
        live: AtomicI64::new(0),
        peak: AtomicI64::new(0),
        top: AtomicI64::new(0),
    }
}

static COUNTERS: [Counter; COMPONENTS] = [counter(), counter(), counter()];

fn count(component: u8, delta: i64) {
    let Some(counter) = COUNTERS.get(usize::from(component)) else {
        return;
    };
    let live = counter.live.fetch_add(delta, Ordering::Relaxed) + delta;
    if delta > 0 {
        counter.peak.fetch_max(live, Ordering::Relaxed);
        counter.top.fetch_max(live, Ordering::Relaxed);
    }
}

/// Live heap bytes of `component` now.
pub fn live(component: Component) -> i64 {
    COUNTERS[component as usize].live.load(Ordering::Relaxed)
}

/// The highest live heap of `component` since the last [`reset_peak`].
pub fn peak(component: Component) -> i64 {
    COUNTERS[component as usize].peak.load(Ordering::Relaxed)
}

/// The highest live heap of `component` since the process started.
pub fn top(component: Component) -> i64 {
    COUNTERS[component as usize].top.load(Ordering::Relaxed)
}

/// Starts a new peak at the live bytes of now.
pub fn reset_peak(component: Component) {
    let counter = &COUNTERS[component as usize];
    counter
        .peak
        .store(counter.live.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// mimalloc with a component tag before each block.
pub struct Tagged;

/// The block mimalloc is asked for, and where the caller's part starts in it: the
/// header is as large as the alignment (at least 16 bytes), so the caller's part
/// stays aligned.
fn outer(layout: Layout) -> Option<(Layout, usize)> {
    let offset = layout.align().max(16);
    let size = layout.size().checked_add(offset)?;
    let outer = Layout::from_size_align(size, offset).ok()?;
    Some((outer, offset))
}

/// Tags a block mimalloc gave (`base`, null if it gave none) with the calling
/// thread's component and counts it: the caller's part of it.
///
/// # Safety
/// `base` is null or a block of at least `offset` + `layout.size()` bytes.
unsafe fn tagged(base: *mut u8, offset: usize, layout: Layout) -> *mut u8 {
    if base.is_null() {
        return base;
    }
    let component = COMPONENT.try_with(Cell::get).unwrap_or(0);
    // SAFETY: the block is at least `offset` (>= 16) bytes long.
    unsafe {
        base.write(component);
    }
    count(component, layout.size() as i64);
    // SAFETY: within the block.
    unsafe { base.add(offset) }
}

unsafe impl GlobalAlloc for Tagged {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some((outer, offset)) = outer(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `outer` has a non-zero size (the header); what mimalloc gives is
        // `outer` long.
        unsafe { tagged(MiMalloc.alloc(outer), offset, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let Some((outer, offset)) = outer(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `alloc`.
        unsafe { tagged(MiMalloc.alloc_zeroed(outer), offset, layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some((outer, offset)) = outer(layout) else {
            return;
        };
        // SAFETY: `ptr` came from `alloc` with this layout: the header is before it.
        let base = unsafe { ptr.sub(offset) };
        // SAFETY: the header's first byte, written by `alloc`.
        let component = unsafe { base.read() };
        count(component, -(layout.size() as i64));
        // SAFETY: `base` was allocated by mimalloc with `outer`.
        unsafe { MiMalloc.dealloc(base, outer) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some((outer, offset)) = outer(layout) else {
            return std::ptr::null_mut();
        };
        let Some(new_outer) = new_size.checked_add(offset) else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `dealloc`.
        let base = unsafe { ptr.sub(offset) };
        // SAFETY: as in `dealloc`.
        let component = unsafe { base.read() };
        // SAFETY: `base` was allocated by mimalloc with `outer`; the header moves
        // with the block.
        let moved = unsafe { MiMalloc.realloc(base, outer, new_outer) };
        if moved.is_null() {
            return moved;
        }
        count(component, new_size as i64 - layout.size() as i64);
        // SAFETY: within the block.
        unsafe { moved.add(offset) }
    }
}
