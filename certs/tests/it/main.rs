//! The integration tests of the certificates and bootstrap, in one binary: one link instead of one per
//! file, and the tests of every file run side by side.

mod bootstrap;
mod common;
mod csr;
mod self_signed;
mod tls_handshake;
