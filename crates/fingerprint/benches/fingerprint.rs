//! Criterion benchmark of the request fingerprint on a typical ~500-byte order
//! body, next to a serde_json parse + serialize round trip of the same bytes as
//! the yardstick (the target is at most 3x the round trip).

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use keyhold_fingerprint::{parse, Spec};

/// A realistic `POST /v1/orders` body: items, optional ids and metadata.
const ORDER_BODY: &str = r#"{
  "client_order_id": "web-2024-11-29-000184",
  "cart_id": "cart_8f14e45fceea167a5a36dedd4bea2543",
  "amount": 15497,
  "currency": "EUR",
  "items": [
    {"sku": "SKU-TSHIRT-BLK-M", "quantity": 2},
    {"sku": "SKU-MUG-0042", "quantity": 1},
    {"sku": "SKU-STICKER-PACK", "quantity": 5}
  ],
  "shipping_address_id": "addr_01HZX3Q9K2M7",
  "quote_id": "quote_7c9e6679",
  "metadata": {"channel": "web", "campaign": "black-friday", "note": "Gift wrap, please. Merci beaucoup!", "ab": "variant-b"}
}"#;

fn order_500b(c: &mut Criterion) {
    let body = ORDER_BODY.as_bytes();
    let spec = Spec::orders();
    let mut group = c.benchmark_group("order_500b");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("fingerprint", |b| {
        b.iter(|| {
            let value = parse(black_box(body)).expect("valid body");
            spec.fingerprint(&value)
        })
    });
    group.bench_function("serde_json_roundtrip", |b| {
        b.iter(|| {
            let value: serde_json::Value =
                serde_json::from_slice(black_box(body)).expect("valid body");
            serde_json::to_vec(&value).expect("serializable")
        })
    });
    group.finish();
}

criterion_group!(benches, order_500b);
criterion_main!(benches);
