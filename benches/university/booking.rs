//! The booking API as the bench uses it: an admin who books for users (an exception
//! to the rules but capacity) and reads the models, and each user reading their
//! booking.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};
use futures::stream::{self, StreamExt};
use gpu_booking_sim::ApiServer;
use serde_json::{json, Value};

use crate::cluster::MODELS;
use crate::figures::{secs, spread};
use crate::lab::University;

/// Admins' booking requests in flight at once.
pub const BOOKINGS_AT_ONCE: usize = 32;

/// The booking API as an admin and as each user.
pub struct Booking {
    pub api: ApiServer,
    pub admin: String,
    pub http: reqwest::Client,
}

impl Booking {
    pub async fn models(&self) -> anyhow::Result<Vec<Value>> {
        let models: Value = self
            .http
            .get(format!("{}/api/v1/models", self.api.url))
            .bearer_auth(&self.admin)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(models.as_array().cloned().unwrap_or_default())
    }

    /// Books `model` for `user` from `start` for two hours, as an admin (an
    /// exception to the rules but capacity): the booking's id and how long the
    /// create took.
    pub async fn book(
        &self,
        user: &str,
        model: &str,
        start: DateTime<Utc>,
    ) -> anyhow::Result<(i64, Duration)> {
        let began = Instant::now();
        let resp = self
            .http
            .post(format!("{}/api/v1/bookings", self.api.url))
            .bearer_auth(&self.admin)
            .json(&json!({"model": model, "user": user, "start": start,
                "end": start + TimeDelta::hours(2), "override": true}))
            .send()
            .await?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(
            status.is_success(),
            "booking {model} for {user}: {status} {body}"
        );
        let id = body["id"].as_i64().context("a booking id")?;
        Ok((id, began.elapsed()))
    }

    pub async fn end(&self, id: i64) -> anyhow::Result<()> {
        self.http
            .delete(format!("{}/api/v1/bookings/{id}", self.api.url))
            .bearer_auth(&self.admin)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// The booking as its user sees it (`waiting` says why its pod waits).
    pub async fn shown(&self, user: &str, id: i64) -> anyhow::Result<Value> {
        let token = self.api.token(user, None)?;
        Ok(self
            .http
            .get(format!("{}/api/v1/bookings/{id}", self.api.url))
            .bearer_auth(token)
            .send()
            .await?
            .json()
            .await?)
    }
}

/// Bookings per model: `total` shared in proportion to what each model can book
/// (its cards less those research holds), never more than that.
pub fn share(total: usize, bookable: &[u64; MODELS.len()]) -> [usize; MODELS.len()] {
    let sum: u64 = bookable.iter().sum();
    let mut out = [0usize; MODELS.len()];
    if sum == 0 {
        return out;
    }
    let total = total.min(sum as usize);
    let mut rest: Vec<(f64, usize)> = Vec::new();
    for (i, &b) in bookable.iter().enumerate() {
        let exact = total as f64 * b as f64 / sum as f64;
        out[i] = exact.floor() as usize;
        rest.push((exact - exact.floor(), i));
    }
    rest.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut left = total - out.iter().sum::<usize>();
    for (_, i) in rest.iter().cycle() {
        if left == 0 {
            break;
        }
        if (out[*i] as u64) < bookable[*i] {
            out[*i] += 1;
            left -= 1;
        }
    }
    out
}

/// One booked user of a burst.
pub struct Booked {
    pub user: String,
    pub model: usize,
    pub booking: i64,
}

/// Books `users` (`model` each) starting now, in one burst of creates; waits until
/// the webhook's replica holds them.
pub async fn book_all(
    u: &University,
    users: Vec<(String, usize)>,
    label: &str,
) -> anyhow::Result<Vec<Booked>> {
    let start = Utc::now();
    let began = Instant::now();
    let results: Vec<anyhow::Result<(Booked, Duration)>> =
        stream::iter(users.into_iter().map(|(user, model)| async move {
            let (booking, took) = u.booking.book(&user, MODELS[model].name, start).await?;
            Ok((
                Booked {
                    user,
                    model,
                    booking,
                },
                took,
            ))
        }))
        .buffer_unordered(BOOKINGS_AT_ONCE)
        .collect()
        .await;
    let mut booked = Vec::new();
    let mut times = Vec::new();
    for r in results {
        let (b, took) = r?;
        booked.push(b);
        times.push(took);
    }
    let created = began.elapsed();
    let ids: Vec<i64> = booked.iter().map(|b| b.booking).collect();
    let seen = u.webhook_sees(&ids, |b| b.is_some()).await?;
    println!(
        "{label}: {} bookings created in {} ({} clients; each {}), all in the webhook's replica {} later",
        booked.len(),
        secs(created),
        BOOKINGS_AT_ONCE,
        spread(&times),
        secs(seen)
    );
    Ok(booked)
}
