//! The roles a caller may hold.

/// What a caller may do. A token holds any number of roles; `user` is implied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    User,
    Service,
    Admin,
}
