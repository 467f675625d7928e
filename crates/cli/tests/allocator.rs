//! The allocator's options: jemalloc as the workspace builds it (for the node
//! binary and every bench) carries the run-time options of
//! `.cargo/config.toml` (`JEMALLOC_SYS_WITH_MALLOC_CONF`), so that freed
//! memory goes back to the OS within about a second, from jemalloc's
//! background thread. Without them a node's RSS stayed up to a few hundred
//! MiB above its heap after each snapshot build (docs/benchmarks.md, "Page
//! records inside the cache"). A build from a directory without that config
//! (or with the variable set otherwise) fails here.

use tikv_jemalloc_ctl::config;

#[test]
fn jemalloc_is_built_to_hand_back_freed_memory_within_a_second() {
    let options = config::malloc_conf::read().expect("jemalloc's config.malloc_conf");
    // tikv-jemalloc-ctl hands the C string back with its NUL.
    let options: Vec<&str> = options.trim_end_matches('\0').split(',').collect();
    for wanted in [
        "background_thread:true",
        "dirty_decay_ms:1000",
        "muzzy_decay_ms:0",
    ] {
        assert!(
            options.contains(&wanted),
            "{wanted} missing from jemalloc's built-in options {options:?}"
        );
    }
}
