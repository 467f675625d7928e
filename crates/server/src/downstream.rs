//! Downstream effects: the outbox relay and the two consumers (inventory and
//! payments) that turn each `order.created` event into exactly one effect.
//!
//! Delivery is at least once: each consumer has a durable cursor in the outbox,
//! handles the events after it (a bounded number at a time), and moves the cursor
//! only past events it finished. A crash anywhere means the events after the
//! cursor are delivered again. What keeps effects single is that each consumer
//! writes its processed-message entry `(event_id, consumer)` in the same atomic
//! command as its effect, and the payments consumer calls the payment provider with
//! an `Idempotency-Key` derived from the event id, so a charge retried after a lost
//! answer is the same charge. A charge request the provider refuses is settled
//! only after looking the key up at the provider: an earlier attempt (this
//! round's, whose answer was lost, or one before a crash) may have charged.
//!
//! An event of a tenant a failover took away from this region is not this
//! region's to take effect for (`Disposition`, by the store's marks of the
//! loss): one the failover carried is the new home's, and one it lost is an
//! orphan's, listed for compensation, whose payment is only looked up at the
//! provider. Such events are settled without an effect (the cursor moves past
//! them). The relay runs only while the region lease holds, so the registry
//! replica it reads knows every failover that could have taken a tenant
//! away, and it holds back the events of a tenant lost by a done failover
//! until the reconciliation has marked the loss (`reconcile.rs`).
//!
//! A round prepares its events in parallel (bounded: the charges), then tells
//! the store once: one batch command per consumer holds every finished event's
//! effect and the cursor move past the finished prefix, since each command is
//! applied serially on the region's state machine and the store's commands per
//! order bound the new-order rate.

use crate::config::Downstream;
use crate::limits::{
    PSP_ATTEMPTS_MAX, PSP_BACKOFF_MS_BASE, PSP_BACKOFF_MS_MAX, PSP_REQUEST_TIMEOUT_MS,
    RELAY_BACKOFF_MS_MAX, RELAY_BATCH_EVENTS_MAX, RELAY_IDLE_POLL_MS, RELAY_INFLIGHT_EVENTS_MAX,
    RELAY_LINGER_MS,
};
use crate::node::{now, Node};
use keyhold_core::Item;
use keyhold_store::{ConsumeOutcome, Consumer, Disposition, OutboxEvent};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// Set to a consumer's name, the process aborts right after that consumer's first
/// effect is durable and before its cursor moves: the fault tests' way to kill a
/// consumer between its effect and its acknowledgement. While it is set, that
/// consumer's rounds move the cursor in a command of their own.
pub const FAULT_ENV: &str = "KEYHOLD_FAULT_ABORT_AFTER_EFFECT";

/// The consumers of this node's region: inventory always, payments when a
/// payment provider is configured. Their cursors decide what the sweeper may
/// delete, also while their relays are off.
pub fn consumers(node: &Node) -> Vec<Consumer> {
    let mut out = vec![Consumer::Inventory];
    if node.config().psp_url.is_some() {
        out.push(Consumer::Payments);
    }
    out
}

/// The consumers whose relay loops this node runs: every one of
/// [`consumers`], or none with `downstream = "off"` (the events wait in the
/// outbox, kept from the sweeper by the cursors that do not move).
pub fn relayed(node: &Node) -> Vec<Consumer> {
    match node.config().downstream {
        Downstream::On => consumers(node),
        Downstream::Off => Vec::new(),
    }
}

/// Why an event was not finished this round; it is delivered again later.
#[derive(Debug)]
struct Failure(String);

#[derive(Deserialize)]
struct EventPayload {
    order: EventOrder,
    #[serde(default)]
    items: Vec<Item>,
}

#[derive(Deserialize)]
struct EventOrder {
    order_id: String,
    amount: u64,
    currency: String,
}

/// Runs one consumer's relay loop until `stop` flips.
pub async fn run(node: Arc<Node>, consumer: Consumer, mut stop: watch::Receiver<bool>) {
    let mut failures: u32 = 0;
    // Highest sequence handed to this consumer since start: anything at or below
    // it that comes round again is a redelivery.
    let mut attempted: u64 = 0;
    loop {
        // One relay per consumer and region: on its store's leader. A new leader
        // resumes from the durable cursor; what the old one delivered but had not
        // yet moved the cursor past is delivered again and deduplicated.
        if !node.wait_to_lead_region(&mut stop).await {
            return;
        }
        let started = tokio::time::Instant::now();
        let round = relay_round(&node, consumer, &mut attempted).await;
        let linger = started + Duration::from_millis(RELAY_LINGER_MS);
        let pause = match round {
            Ok(0) => {
                failures = 0;
                // Idle: wake on a new order or after the poll interval, then
                // let the orders right behind it join the same round.
                tokio::select! {
                    _ = node.outbox_notify.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(RELAY_IDLE_POLL_MS)) => {}
                    _ = stop.changed() => return,
                }
                let linger = tokio::time::Instant::now() + Duration::from_millis(RELAY_LINGER_MS);
                tokio::select! {
                    _ = tokio::time::sleep_until(linger) => {}
                    _ = stop.changed() => return,
                }
                continue;
            }
            Ok(n) if n >= RELAY_BATCH_EVENTS_MAX => {
                // A full round: more are waiting, go on at once.
                failures = 0;
                continue;
            }
            Ok(_) => {
                failures = 0;
                linger.saturating_duration_since(tokio::time::Instant::now())
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(consumer = %consumer, error = %e.0, "relay round failed; backing off");
                backoff(failures, RELAY_BACKOFF_MS_MAX)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Exponential backoff with full jitter: uniform in `[0, min(max, base * 2^n))`.
fn backoff(attempt: u32, max_ms: u64) -> Duration {
    let ceiling = PSP_BACKOFF_MS_BASE
        .saturating_mul(1u64 << attempt.min(20))
        .min(max_ms)
        .max(1);
    Duration::from_millis(rand::random::<u64>() % ceiling)
}

/// Delivers the next batch after the cursor; returns how many events it finished.
async fn relay_round(
    node: &Arc<Node>,
    consumer: Consumer,
    attempted: &mut u64,
) -> Result<usize, Failure> {
    // Effects only under the region lease: a region cut off from the
    // registry may have been failed over, and one that just came back reads
    // a registry replica that may not show the failover yet; with the lease,
    // the replica has applied what the registry had at the last contact.
    if !node.lease().holds() {
        return Ok(0);
    }
    let store = node.store();
    // The generation read here goes with the cursor move at the end: an outbox
    // replay in between makes that move a no-op instead of undoing the replay.
    let keyhold_store::Cursor {
        seq: cursor,
        generation,
    } = store
        .cursor_at(consumer)
        .await
        .map_err(|e| Failure(e.to_string()))?;
    let events = store
        .outbox_after_disposed(cursor, RELAY_BATCH_EVENTS_MAX)
        .await
        .map_err(|e| Failure(e.to_string()))?;
    let lag = events.first().map_or(0.0, |(e, _)| {
        now().0.saturating_sub(e.occurred_at.0) as f64 / 1000.0
    });
    metrics::gauge!("keyhold_outbox_lag_seconds", "consumer" => consumer.as_str()).set(lag);
    if events.is_empty() {
        return Ok(0);
    }
    let events = dispositions(node, events)?;
    if events.is_empty() {
        return Ok(0);
    }
    for (e, _) in &events {
        let label = if e.seq <= *attempted {
            "redelivery"
        } else {
            "delivery"
        };
        metrics::counter!("keyhold_outbox_deliveries_total", "consumer" => consumer.as_str(), "kind" => label)
            .increment(1);
    }
    *attempted = (*attempted).max(events.last().map_or(0, |(e, _)| e.seq));

    // Each event is prepared on its own (the payments consumer's charges run in
    // parallel, bounded); the store hears of the round once, in one command.
    let limit = Arc::new(Semaphore::new(RELAY_INFLIGHT_EVENTS_MAX));
    let mut tasks = Vec::with_capacity(events.len());
    for (event, disposition) in &events {
        let (event, disposition) = (event.clone(), *disposition);
        let node = node.clone();
        let permit = limit
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore is never closed");
        tasks.push(tokio::spawn(async move {
            let result = prepare(&node, consumer, &event, disposition).await;
            drop(permit);
            result
        }));
    }
    // The cursor moves past the longest finished prefix, so an event is never
    // skipped because a later one finished first. Every finished event is
    // recorded, also after a failed one: its effect (a charge made) is kept.
    let mut done_to = cursor;
    let mut first_error = None;
    let mut effects = Vec::new();
    for ((event, _), task) in events.iter().zip(tasks) {
        let result = task
            .await
            .unwrap_or_else(|e| Err(Failure(format!("consumer task failed: {e}"))));
        match result {
            Ok(prepared) => {
                if let Prepared::Effect(effect) = prepared {
                    effects.push((event, effect));
                }
                if first_error.is_none() {
                    done_to = event.seq;
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    // With the fault hook armed the cursor moves in a command of its own, so
    // that there is a moment between the effect and its acknowledgement.
    let fault = std::env::var(FAULT_ENV).is_ok_and(|v| v == consumer.as_str());
    let mut cursor_moved = false;
    if !effects.is_empty() {
        let move_to = (done_to > cursor && !fault).then_some(keyhold_store::Cursor {
            seq: done_to,
            generation,
        });
        let refused = record(node, consumer, effects, move_to).await?;
        cursor_moved = move_to.is_some();
        if let Some(e) = refused {
            first_error.get_or_insert(e);
        }
    }
    if done_to > cursor && !cursor_moved {
        store
            .advance_cursor(consumer, done_to, generation)
            .await
            .map_err(|e| Failure(e.to_string()))?;
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(events.len()),
    }
}

/// The round's events in order, each with whose it is to take effect for,
/// up to the first one held back: an event of a tenant a done failover took
/// away from this region whose loss the store has not marked yet (the
/// reconciliation marks it moments after the region is back). The next round
/// starts at that event again.
fn dispositions(
    node: &Node,
    mut events: Vec<(OutboxEvent, Disposition)>,
) -> Result<Vec<(OutboxEvent, Disposition)>, Failure> {
    let unmarked = crate::reconcile::unmarked_losses(node).map_err(Failure)?;
    let held_back = events.iter().position(|(event, disposition)| {
        *disposition == Disposition::Ours && unmarked.contains(event.tenant.as_str())
    });
    if let Some(first) = held_back {
        events.truncate(first);
    }
    Ok(events)
}

/// What one event needs from the round's command.
enum Prepared {
    /// Nothing: processed already, unreadable (skipped loudly), or not this
    /// region's (its tenant was lost in a failover).
    Skip,
    Effect(Effect),
}

/// One event's effect, to be recorded in the round's command.
enum Effect {
    Inventory(keyhold_store::InventoryEffect),
    Payment(keyhold_store::PaymentEffect),
}

/// Everything about one event short of recording its effect: whether it was
/// processed already or is not this region's (`disposition`), and for
/// payments the charge at the provider (for an orphan, the lookup of one).
async fn prepare(
    node: &Node,
    consumer: Consumer,
    event: &OutboxEvent,
    disposition: Disposition,
) -> Result<Prepared, Failure> {
    // A redelivered event whose effect is recorded needs no work at all.
    let processed = node
        .store()
        .is_processed(consumer, &event.event_id)
        .await
        .map_err(|e| Failure(e.to_string()))?;
    if processed {
        metrics::counter!("keyhold_consumer_duplicates_skipped_total", "consumer" => consumer.as_str())
            .increment(1);
        return Ok(Prepared::Skip);
    }
    let payload: EventPayload = match serde_json::from_slice(&event.payload) {
        Ok(p) => p,
        Err(e) => {
            // Events are written by this program; an unreadable one is a bug, and
            // retrying would not help. Skip it loudly rather than stall the outbox.
            tracing::error!(event_id = %event.event_id, error = %e, "unreadable outbox event skipped");
            metrics::counter!("keyhold_outbox_unreadable_total").increment(1);
            return Ok(Prepared::Skip);
        }
    };
    let (event_id, order_id) = (event.event_id.clone(), payload.order.order_id.clone());
    let provider = || {
        let base = node.config().psp_url.as_deref();
        let key = format!("keyhold-pay-{}", event.event_id);
        (base.expect("payments runs only with a provider"), key)
    };
    let (charge_id, paid) = match (disposition, consumer) {
        (Disposition::Ours, Consumer::Inventory) => {
            return Ok(Prepared::Effect(Effect::Inventory(
                keyhold_store::InventoryEffect {
                    seq: event.seq,
                    event_id,
                    order_id,
                    items: payload.items,
                },
            )));
        }
        (Disposition::Ours, Consumer::Payments) => {
            let (base, key) = provider();
            charge(node.http(), base, &key, &payload.order).await?
        }
        // An orphan's payment is never charged now; an attempt before the
        // loss may have charged, and then the orphan is listed `charged`.
        (Disposition::Orphan, Consumer::Payments) => {
            let (base, key) = provider();
            match charge_by_key(node.http(), base, &key).await? {
                Some(c) => (c.id, c.status == "succeeded"),
                None => return Ok(not_ours(consumer)),
            }
        }
        (Disposition::Carried, _) | (Disposition::Orphan, Consumer::Inventory) => {
            return Ok(not_ours(consumer));
        }
    };
    Ok(Prepared::Effect(Effect::Payment(
        keyhold_store::PaymentEffect {
            seq: event.seq,
            event_id,
            order_id,
            charge_id,
            paid,
        },
    )))
}

/// An event settled without an effect: its tenant was lost in a failover.
fn not_ours(consumer: Consumer) -> Prepared {
    metrics::counter!("keyhold_outbox_not_ours_total", "consumer" => consumer.as_str())
        .increment(1);
    Prepared::Skip
}

/// Records a round's effects, and with `cursor` its cursor move, in one
/// command. Returns the first event the store refused (it is delivered again;
/// the store stopped the cursor before it).
async fn record(
    node: &Node,
    consumer: Consumer,
    effects: Vec<(&OutboxEvent, Effect)>,
    cursor: Option<keyhold_store::Cursor>,
) -> Result<Option<Failure>, Failure> {
    let store = node.store();
    let (events, effects): (Vec<&OutboxEvent>, Vec<Effect>) = effects.into_iter().unzip();
    // A consumer prepares effects of its own kind only.
    let (mut reservations, mut payments) = (Vec::new(), Vec::new());
    for effect in effects {
        match effect {
            Effect::Inventory(e) => reservations.push(e),
            Effect::Payment(e) => payments.push(e),
        }
    }
    let outcome = match consumer {
        Consumer::Inventory => {
            store
                .consume_inventory_batch(reservations, cursor, now(), node.policy())
                .await
        }
        Consumer::Payments => {
            store
                .consume_payment_batch(payments, cursor, now(), node.policy())
                .await
        }
    }
    .map_err(|e| Failure(e.to_string()))?;
    let mut refused = None;
    let mut applied = false;
    for (event, result) in events.into_iter().zip(outcome.events) {
        match result {
            Ok(ConsumeOutcome::Duplicate) => {
                metrics::counter!("keyhold_consumer_duplicates_skipped_total", "consumer" => consumer.as_str())
                    .increment(1);
            }
            // The store found the event's tenant lost after the round read
            // it: settled without an effect.
            Ok(ConsumeOutcome::NotOurs) => {
                metrics::counter!("keyhold_outbox_not_ours_total", "consumer" => consumer.as_str())
                    .increment(1);
            }
            Ok(ConsumeOutcome::Applied) => {
                applied = true;
                metrics::counter!("keyhold_consumer_effects_total", "consumer" => consumer.as_str())
                    .increment(1);
                // From the order's commit to its effect: the relay's end-to-end lag.
                let lag_ms = now().0.saturating_sub(event.occurred_at.0);
                metrics::histogram!("keyhold_outbox_delivery_lag_seconds", "consumer" => consumer.as_str())
                    .record(lag_ms as f64 / 1000.0);
            }
            Err(rejection) => {
                refused.get_or_insert(Failure(rejection.to_string()));
            }
        }
    }
    if applied && std::env::var(FAULT_ENV).is_ok_and(|v| v == consumer.as_str()) {
        tracing::error!(
            consumer = consumer.as_str(),
            "fault injection: aborting after the effect, before the ack"
        );
        std::process::abort();
    }
    Ok(refused)
}

#[derive(Deserialize)]
struct Charge {
    id: String,
    status: String,
}

/// Charges the payment provider at `base` for the order under `key`, retrying
/// lost answers with the same key. Returns the charge id and whether it
/// succeeded.
async fn charge(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    order: &EventOrder,
) -> Result<(String, bool), Failure> {
    let url = format!("{}/v1/charges", base.trim_end_matches('/'));
    let body = serde_json::json!({
        "order_id": order.order_id,
        "amount": order.amount,
        "currency": order.currency,
    });
    let mut last_error = String::new();
    for attempt in 0..PSP_ATTEMPTS_MAX {
        if attempt > 0 {
            metrics::counter!("keyhold_psp_retries_total").increment(1);
            tokio::time::sleep(backoff(attempt, PSP_BACKOFF_MS_MAX)).await;
        }
        let sent = http
            .post(&url)
            .header("Idempotency-Key", key)
            .timeout(Duration::from_millis(PSP_REQUEST_TIMEOUT_MS))
            .json(&body)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                last_error = format!("request failed: {e}");
                continue;
            }
        };
        let status = response.status().as_u16();
        // A dropped answer fails here, after the provider committed: retry with
        // the same key and the provider returns the same charge.
        let parsed = match response.bytes().await {
            Ok(bytes) => serde_json::from_slice::<Charge>(&bytes).ok(),
            Err(e) => {
                last_error = format!("answer lost: {e}");
                continue;
            }
        };
        match (status, parsed) {
            (200..=299 | 402, Some(c)) => return Ok((c.id, c.status == "succeeded")),
            // The provider refuses the request itself (not a decline, not a
            // retryable condition): retrying with the same key would be refused
            // forever and stall every later event. But a lost answer (this round,
            // or before a crash) may have hidden a charge that went through, and
            // a refused retry says nothing about it: ask the provider by key.
            (400..=499, _) if !matches!(status, 408 | 409 | 425 | 429) => {
                return match charge_by_key(http, base, key).await? {
                    Some(c) => Ok((c.id, c.status == "succeeded")),
                    None => {
                        tracing::error!(order_id = %order.order_id, status, "payment provider refused the charge request and holds no charge for its key");
                        metrics::counter!("keyhold_psp_refusals_total").increment(1);
                        Ok((String::new(), false))
                    }
                };
            }
            (s, _) => last_error = format!("provider answered {s}"),
        }
    }
    Err(Failure(format!(
        "charge for {} not confirmed after {PSP_ATTEMPTS_MAX} attempts: {last_error}",
        order.order_id
    )))
}

/// The charge the provider made under `key`, `None` when it made none. Any
/// answer but the charge or the provider's own `not_found` (a bare 404 may be a
/// provider without this lookup) is a failure: the event is delivered again
/// rather than settled on a guess.
async fn charge_by_key(
    http: &reqwest::Client,
    base: &str,
    key: &str,
) -> Result<Option<Charge>, Failure> {
    let mut url = reqwest::Url::parse(base).map_err(|e| Failure(format!("provider url: {e}")))?;
    url.path_segments_mut()
        .map_err(|()| Failure("provider url cannot have a path".into()))?
        .pop_if_empty()
        .extend(["v1", "charges", "by-key", key]);
    let response = http
        .get(url)
        .timeout(Duration::from_millis(PSP_REQUEST_TIMEOUT_MS))
        .send()
        .await
        .map_err(|e| Failure(format!("charge lookup failed: {e}")))?;
    match response.status().as_u16() {
        404 => {
            #[derive(Deserialize)]
            struct Refusal {
                error: String,
            }
            match response.json::<Refusal>().await {
                Ok(r) if r.error == "not_found" => Ok(None),
                _ => Err(Failure(
                    "charge lookup is not supported by the provider".into(),
                )),
            }
        }
        200 => response
            .json::<Charge>()
            .await
            .map(Some)
            .map_err(|e| Failure(format!("charge lookup answer unreadable: {e}"))),
        other => Err(Failure(format!("charge lookup answered {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyhold_fakepsp::PspConfig;

    async fn provider(config: PspConfig) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(keyhold_fakepsp::run(config, listener, async {
            let _ = stopped.await;
        }));
        (base, stop)
    }

    fn order(order_id: &str) -> EventOrder {
        EventOrder {
            order_id: order_id.into(),
            amount: 1_000,
            currency: "EUR".into(),
        }
    }

    /// Review defect 6: the provider commits the charge and loses the answer;
    /// the retry with the same key is refused for good (400). The charge went
    /// through, so the payment must settle as paid, never as failed.
    #[tokio::test]
    async fn a_refused_retry_after_a_lost_answer_settles_as_the_charge_made() {
        let dir = tempfile::tempdir().unwrap();
        let config = PspConfig {
            drop_response_rate: 1.0,
            refuse_replay_rate: 1.0,
            ..PspConfig::new(dir.path())
        };
        let (base, _stop) = provider(config).await;
        let http = reqwest::Client::new();
        let (charge_id, paid) = charge(&http, &base, "keyhold-pay-evt_1", &order("ord_1"))
            .await
            .unwrap();
        assert!(paid, "the charge went through");
        assert!(charge_id.starts_with("ch_"), "{charge_id}");
        let listed: serde_json::Value = http
            .get(format!("{base}/v1/charges"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(listed["data"].as_array().unwrap().len(), 1);
        assert_eq!(listed["data"][0]["id"], charge_id.as_str());
    }

    /// A refusal with no charge behind the key settles as failed, and the
    /// lookup percent-encodes keys that are not path-safe.
    #[tokio::test]
    async fn a_refusal_without_a_charge_settles_as_failed() {
        let dir = tempfile::tempdir().unwrap();
        let (base, _stop) = provider(PspConfig::new(dir.path())).await;
        let http = reqwest::Client::new();
        assert!(charge_by_key(&http, &base, "no/such?key#")
            .await
            .unwrap()
            .is_none());
        // Not EUR-shaped: the provider refuses the request (400), charges nothing.
        let bad = EventOrder {
            currency: "euro".into(),
            ..order("ord_2")
        };
        let (charge_id, paid) = charge(&http, &base, "keyhold-pay-evt_2", &bad)
            .await
            .unwrap();
        assert!(!paid);
        assert!(charge_id.is_empty());
    }
}
