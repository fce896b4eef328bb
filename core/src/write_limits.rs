//! Rate limits on the booking service's writes: per user and per source address.
//!
//! Every write (`POST`, `PUT`, `PATCH`, `DELETE`) of a person takes a token from
//! their user's bucket and from their address's bucket ([`KeyedBuckets`], bounded
//! memory); an empty bucket refuses the write, with the time after which one token
//! is back. Reads are not limited (they write nothing), and neither are callers with
//! the `service` role (the webhook, the controller and the agents report on a timer,
//! and a limit there would only delay what the cluster did).

use std::net::IpAddr;
use std::time::Instant;

use crate::rate::KeyedBuckets;

/// Whether a request with this method writes (and so is limited).
pub fn is_write(method: &str) -> bool {
    matches!(method, "POST" | "PUT" | "PATCH" | "DELETE")
}

/// One limit: `burst` writes at once, `per_second` on average after that. A zero
/// burst turns the limit off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub burst: u32,
    pub per_second: f64,
}

impl Limit {
    fn is_on(&self) -> bool {
        self.burst > 0 && self.per_second.is_finite() && self.per_second > 0.0
    }

    /// Whole seconds until a refused caller has a token again: at most the time one
    /// token takes to come back (a refused bucket holds less than one).
    fn retry_after(&self) -> u64 {
        let secs = (1.0 / self.per_second).ceil();
        if secs.is_finite() && secs >= 1.0 {
            secs as u64
        } else {
            1
        }
    }
}

/// Whose limit refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    User,
    Source,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::User => "user",
            Scope::Source => "source",
        }
    }
}

/// A refused write: whose limit, and in how many seconds to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub scope: Scope,
    pub retry_after_secs: u64,
}

impl Limited {
    /// What the caller is told.
    pub fn message(&self) -> String {
        let whose = match self.scope {
            Scope::User => "this user",
            Scope::Source => "this address",
        };
        format!(
            "Too many changes from {whose} in a short time; try again in {} s.",
            self.retry_after_secs
        )
    }
}

/// The limits of one replica of the service. Not shared by itself: the service
/// keeps it behind a lock.
#[derive(Debug, Clone)]
pub struct WriteLimits {
    user: Limit,
    source: Limit,
    users: KeyedBuckets<String>,
    sources: KeyedBuckets<IpAddr>,
}

impl WriteLimits {
    /// Per-user and per-source limits, each keeping the buckets of at most
    /// `max_keys` callers (beyond that, new callers share one bucket).
    pub fn new(user: Limit, source: Limit, max_keys: usize) -> Self {
        Self {
            user,
            source,
            users: KeyedBuckets::new(user.burst, user.per_second, max_keys),
            sources: KeyedBuckets::new(source.burst, source.per_second, max_keys),
        }
    }

    /// No limit at all.
    pub fn off() -> Self {
        let off = Limit {
            burst: 0,
            per_second: 0.0,
        };
        Self::new(off, off, 0)
    }

    /// Takes a write of `user` from `source` (when the address is known) at `now`.
    /// The user's limit is asked first, so that a user over their own limit does
    /// not use up the address's tokens that others behind it share.
    pub fn check(
        &mut self,
        user: &str,
        source: Option<IpAddr>,
        now: Instant,
    ) -> Result<(), Limited> {
        if self.user.is_on() && !self.users.allow(&user.to_owned(), now) {
            return Err(Limited {
                scope: Scope::User,
                retry_after_secs: self.user.retry_after(),
            });
        }
        if let Some(source) = source.filter(|_| self.source.is_on()) {
            if !self.sources.allow(&source_key(source), now) {
                return Err(Limited {
                    scope: Scope::Source,
                    retry_after_secs: self.source.retry_after(),
                });
            }
        }
        Ok(())
    }

    /// Callers with buckets of their own, users and addresses (for tests).
    pub fn keys(&self) -> usize {
        self.users.len() + self.sources.len()
    }
}

/// The key of an address: an IPv4 address as it is (also when IPv4-mapped), an
/// IPv6 address by its /64 prefix, which one host or network gets whole, so that
/// stepping through its addresses does not escape the limit.
fn source_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> WriteLimits {
        WriteLimits::new(
            Limit {
                burst: 3,
                per_second: 0.5,
            },
            Limit {
                burst: 5,
                per_second: 1.0,
            },
            100,
        )
    }

    #[test]
    fn a_user_gets_the_burst_then_waits() {
        let now = Instant::now();
        let mut l = limits();
        let addr: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(l.check("alice", Some(addr), now), Ok(()));
        }
        let refused = l.check("alice", Some(addr), now).unwrap_err();
        assert_eq!(refused.scope, Scope::User);
        // 0.5 per second: a token is back within 2 s.
        assert_eq!(refused.retry_after_secs, 2);
        assert!(refused.message().contains("try again in 2 s"));
        let later = now + Duration::from_secs(refused.retry_after_secs);
        assert_eq!(l.check("alice", Some(addr), later), Ok(()));
        // Another user is not limited by alice's use.
        assert_eq!(l.check("bob", None, now), Ok(()));
    }

    #[test]
    fn an_address_limits_every_user_behind_it() {
        let now = Instant::now();
        let mut l = limits();
        let addr: IpAddr = "10.0.0.1".parse().unwrap();
        for user in ["a", "b", "c", "d", "e"] {
            assert_eq!(l.check(user, Some(addr), now), Ok(()));
        }
        let refused = l.check("f", Some(addr), now).unwrap_err();
        assert_eq!(refused.scope, Scope::Source);
        assert_eq!(refused.retry_after_secs, 1);
        // The same user from another address goes through.
        assert_eq!(l.check("f", Some("10.0.0.2".parse().unwrap()), now), Ok(()));
        // Without a known address only the user's limit applies.
        assert_eq!(l.check("g", None, now), Ok(()));
    }

    #[test]
    fn one_ipv6_network_is_one_source() {
        let now = Instant::now();
        let mut l = limits();
        for i in 0..5u16 {
            let addr = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, i));
            assert_eq!(l.check(&format!("u{i}"), Some(addr), now), Ok(()));
        }
        let other_host = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 9, 9, 9, 9));
        assert_eq!(
            l.check("u9", Some(other_host), now).map_err(|e| e.scope),
            Err(Scope::Source)
        );
        // An IPv4-mapped address is its IPv4 address.
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(source_key(mapped), "10.0.0.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn off_limits_nothing_and_keeps_nothing() {
        let now = Instant::now();
        let mut l = WriteLimits::off();
        let addr: IpAddr = "10.0.0.1".parse().unwrap();
        for i in 0..1000 {
            assert_eq!(l.check(&format!("u{i}"), Some(addr), now), Ok(()));
        }
        assert_eq!(l.keys(), 0);
        assert!(is_write("PATCH") && is_write("DELETE") && !is_write("GET"));
    }
}
