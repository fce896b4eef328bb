//! HTTP handlers, one module per resource.

pub mod admission;
pub mod audit;
pub mod availability;
pub mod bookings;
pub mod changes;
pub mod feeds;
pub mod health;
pub mod me;
pub mod models;
pub mod notebooks;
pub mod notices;
pub mod schedulability;
pub mod units;
pub mod usage;
pub mod waitlist;

/// A user name as the service accepts it ([`gpu_booking_core::username::Username`]),
/// as an ECMA-262 pattern: no control character (Unicode `Cc`) anywhere and no white
/// space (Unicode `White_Space`) at either end. Its length, 1 to
/// [`MAX_USERNAME_BYTES`](gpu_booking_core::username::MAX_USERNAME_BYTES) bytes of
/// UTF-8, is each field's `minLength` and `maxLength`. Every `user` input states
/// this as its `pattern` (utoipa takes only a literal there); a contract test holds
/// each to this constant.
pub const USER_NAME_PATTERN: &str = r"^[^\u0000-\u001f\u007f-\u009f \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000](?:[^\u0000-\u001f\u007f-\u009f]*[^\u0000-\u001f\u007f-\u009f \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000])?$";

/// Text without a control character (Unicode `Cc`), as an ECMA-262 pattern: what
/// the audit report's strings and the schedulability `slug` must be. Stated, like
/// [`USER_NAME_PATTERN`], as a literal in each attribute and held to this constant
/// by a contract test.
pub const NO_CONTROL_PATTERN: &str = r"^[^\u0000-\u001f\u007f-\u009f]*$";

/// The years a day or time of a report may fall in (`from` and `to` of a model's
/// availability and of the usage report; each states them in its description).
pub const REPORT_YEARS: std::ops::RangeInclusive<i32> = 1970..=9998;

/// The most entries one listing answers (`limit` of the bookings, waitlist and
/// audit listings; each documents it as its `maximum`).
pub const MAX_PAGE_LIMIT: i64 = 1000;
