//! Hand freed heap memory back to the OS after sessions left memory.
//!
//! glibc's malloc keeps freed memory in its arenas (one per thread that allocated, and tokio
//! has several) and returns it to the kernel only from the top of the main heap, so after a
//! burst of sessions the resident size stays near its peak although the memory is free.
//! `malloc_trim(0)` releases the free pages of every arena (`madvise(MADV_DONTNEED)`). Other
//! allocators (musl, jemalloc) return memory on their own: there it is a no-op.

/// Release free heap pages to the OS (glibc on Linux; a no-op elsewhere). Takes a few
/// milliseconds on a large heap, so it runs on a blocking thread.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Not awaited: nobody needs the result, and the bus must not wait for it.
        drop(tokio::task::spawn_blocking(|| {
            #[allow(unsafe_code)]
            // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it takes no
            // pointer from us and is safe to call from any thread at any time.
            let released = unsafe { libc::malloc_trim(0) };
            tracing::debug!(released, "free heap memory handed back to the OS");
        }));
    }
}
