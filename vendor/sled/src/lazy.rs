//! This module exists because `lazy_static` causes TSAN to
//! be very unhappy. We rely heavily on TSAN for finding
//! races, so we don't use `lazy_static`.

// clawft patch 5: the value lives in a `std::sync::OnceLock`, whose other callers block while
// one initialises it. sled's own version spun on an `AtomicBool` meanwhile: the IO threads that
// `threadpool::QUEUE`'s initialiser starts spun on it until it returned, ~1.7 ms of CPU at every
// open of the store on two cores, and they could keep the initialiser itself off the CPU.

/// A lazily initialized value
pub struct Lazy<T, F> {
    cell: std::sync::OnceLock<T>,
    init: F,
}

impl<T, F> Lazy<T, F> {
    /// Create a new Lazy
    pub const fn new(init: F) -> Self
    where
        F: Sized,
    {
        Self { cell: std::sync::OnceLock::new(), init }
    }
}

impl<T, F> std::ops::Deref for Lazy<T, F>
where
    F: Fn() -> T,
{
    type Target = T;

    fn deref(&self) -> &T {
        self.cell.get_or_init(|| (self.init)())
    }
}
