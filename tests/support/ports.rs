//! Ports for servers a test starts as child processes (the demo, a real JupyterHub,
//! the binary under hostile input), which must be told a port before they bind it.
//! Included by path (`#[path]`) where needed, one copy of the code.
//!
//! A port found free by binding port 0 comes from the kernel's ephemeral range, which
//! the kernel also hands to every outgoing connection and every other bind to port 0
//! of the tests running beside; between the check and the child's bind, one of those
//! can take it ("Address already in use"). The ports here lie below Linux's default
//! ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999), where only another
//! caller of this module would take them, and one process never hands out one twice.

#![allow(dead_code)]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The ports handed out: [FIRST, END).
const FIRST: u32 = 20_000;
const END: u32 = 32_768;

/// A port on 127.0.0.1 that no one listens on now and that this process has not
/// handed out before.
pub fn free_port() -> u16 {
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = END - FIRST;
    // Each copy of this module (one per test binary, or per `#[path]` include) starts
    // at a random place, so two copies seldom try the same ports; the bind settles the
    // rest.
    let start = *START.get_or_init(|| {
        let random = RandomState::new().build_hasher().finish();
        u32::try_from(random % u64::from(span)).expect("below the span")
    });
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FIRST + (start + offset) % span;
        let port = u16::try_from(port).expect("below 32768");
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{END} on 127.0.0.1");
}

/// [`free_port`] as an address on 127.0.0.1.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()))
}
