#!/usr/bin/env python3
"""Renders bench/out/results.tsv into bench/RESULTS.md (and results.png when
matplotlib is available): for each comparison, the median, min and max of each
variant and the ratio of medians against its goal.

usage: report.py OUT_DIR RESULTS_MD [--section NAME]

With --section (a run of some comparisons only, `bench/run.sh --only ...`), the
run's tables go into a section of their own, with the run's command and date,
replacing an earlier section of the same name; the rest of RESULTS.md stays.
"""
import statistics
import sys
from collections import defaultdict
import re
from pathlib import Path

# Absolute goals: (comparison, variant, goal, "higher"/"lower", what)
ABSOLUTE = [
    ("bridge", "throughput", 50000, "higher", "bridge to JetStream, draining a backlog (envelopes/s)"),
    ("bridge", "latency_p99_ms", 100, "lower", "bridge commit -> JetStream p99 at 1,000 commits/s (ms)"),
    ("bridge", "latency_p50_ms", None, "lower", "bridge commit -> JetStream p50 at 1,000 commits/s (ms)"),
    ("sinks_drain", "rabbitmq", 20000, "higher", "bridge to RabbitMQ with publisher confirms, draining a backlog (envelopes/s)"),
    ("sinks_drain", "webhook", 20000, "higher", "bridge to a local webhook in 1,000-row POSTs, draining a backlog (envelopes/s)"),
    ("sinks_p99_ms", "rabbitmq", 100, "lower", "commit -> RabbitMQ consumer p99 at 1,000 commits/s (ms)"),
    ("sinks_p99_ms", "webhook", 100, "lower", "commit -> webhook receiver p99 at 1,000 commits/s (ms)"),
    ("refusals_p99_ms", "jetstream_poison", 5000, "lower", "an unrelated originator's commit -> JetStream p99 while 5 refused rows a second are set aside beside it (ms)"),
    ("refusals_p99_ms", "redis_poison", 5000, "lower", "the same, Redis (ms)"),
    ("refusals_p99_ms", "mqtt_poison", 5000, "lower", "the same, MQTT (ms)"),
    ("refusals_p99_ms", "rabbitmq_poison", 5000, "lower", "the same, RabbitMQ (ms)"),
    ("refusals_p99_ms", "webhook_poison", 5000, "lower", "the same, webhook (ms)"),
    ("refusals_p99_ms", "jetstream_burst", 5000, "lower", "an unrelated originator's commit -> JetStream p99 while 100 refused rows committed at once are set aside beside it (ms)"),
    ("refusals_p99_ms", "redis_burst", 5000, "lower", "the same, 100 at once, Redis (ms)"),
    ("refusals_p99_ms", "mqtt_burst", 5000, "lower", "the same, 100 at once, MQTT (ms)"),
    ("refusals_p99_ms", "rabbitmq_burst", 5000, "lower", "the same, 100 at once, RabbitMQ (ms)"),
    ("refusals_p99_ms", "webhook_burst", 5000, "lower", "the same, 100 at once, webhook (ms)"),
    ("refusals_set_aside", "jetstream", None, "higher", "refused rows set aside per minute, JetStream (max_payload)"),
    ("refusals_set_aside", "redis", None, "higher", "refused rows set aside per minute, Redis (proto-max-bulk-len)"),
    ("refusals_set_aside", "mqtt", None, "higher", "refused rows set aside per minute, MQTT (PUBACK 0x95)"),
    ("refusals_set_aside", "rabbitmq", None, "higher", "refused rows set aside per minute, RabbitMQ (406 max_message_size)"),
    ("refusals_set_aside", "webhook", None, "higher", "refused rows set aside per minute, webhook (413)"),
    ("lagquery_cost_ms", "originators_10", None, "lower", "consumer_lag, 10 originators (ms a call)"),
    ("lagquery_cost_ms", "originators_10000", None, "lower", "consumer_lag, 10,000 originators (ms a call; asked only after rounds that moved rows)"),
    ("takeover_ms", "egress", None, "lower", "a standby egress bridge's first acknowledgement after the active one is killed (ms)"),
    ("takeover_ms", "ingress", None, "lower", "a standby ingress's first stored position after the active one is killed (ms)"),
    ("idle", "poll_current_10000", 2.0, "lower", "idle consumer poll at 10,000 originators (ms)"),
    ("idle", "cpu_bridge_10000", None, "lower", "idle bridge CPU at 10,000 originators (% of a core)"),
    ("idle", "cpu_backend_10000", None, "lower", "idle bridge's backend CPU at 10,000 originators (% of a core)"),
    *[("readinstr", v, None, "lower", f"instructions per call, {what} (bench/read_instructions.sh)")
      for v, what in [("originator", "select_originator from the start, 1,000 rows"),
                      ("select", "select_gateway_envelopes of one originator, 1,000 rows"),
                      ("select_all", "select_gateway_envelopes after a cursor, every originator"),
                      ("poll", "select_originator at the end of the data"),
                      ("topics", "select_by_topic_cursors, 20 entries"),
                      ("wave", "select_wave over the same entries"),
                      ("newest", "select_newest_by_topic, 4 topics"),
                      ("maxima", "originator_maxima, 5 originators"),
                      ("ceilings", "originator_ceilings()"),
                      ("view", "100 rows of the view, one originator")]],
    ("routerinstr_single_binary", "direct", None, "lower", "single-row insert, binary client, the shard's instructions per call straight"),
    ("routerinstr_single_binary", "routed", None, "lower", "single-row insert, binary client, the shard's instructions per call through the router"),
    ("routerinstr_single_text", "direct", None, "lower", "single-row insert, text client, the shard's instructions per call straight"),
    ("routerinstr_single_text", "routed", None, "lower", "single-row insert, text client, the shard's instructions per call through the router"),
    ("routerinstr_batch_binary", "direct", None, "lower", "100-row batch, binary client, the shard's instructions per call straight"),
    ("routerinstr_batch_binary", "routed", None, "lower", "100-row batch, binary client, the shard's instructions per call through the router"),
    ("routerinstr_mixed_binary", "direct", None, "lower", "100-row batch over 4 originators of one shard, binary client, the shard's instructions per call straight"),
    ("routerinstr_mixed_binary", "routed", None, "lower", "100-row batch over 4 originators of one shard, binary client, the shard's instructions per call through the router"),
    ("routerinstr_select1", "unprepared", None, "lower", "SELECT 1 unprepared, instructions per call"),
    ("routerinstr_select1", "prepared", None, "lower", "SELECT 1 prepared, instructions per call"),
    ("routerpin_insert_cpu0_us", "proxy", None, "lower", "single-row insert through the router, CPU 0 (the clients and the proxy) per call (us)"),
    ("routerpin_insert_cpu0_us", "direct", None, "lower", "single-row insert straight into the shard, CPU 0 (the clients) per call (us)"),
    ("routerpin_insert_cpu1", "proxy", None, "higher", "single-row insert through the router, the shards' CPU busy (%)"),
    ("routerpin_insert_cpu1", "direct", None, "higher", "single-row insert straight into the shard, the shard's CPU busy (%)"),
    ("routerpin_batch_cpu1", "proxy", None, "higher", "100-row batch through the router, the shards' CPU busy (%)"),
    ("routerpin_batch_cpu1", "direct", None, "higher", "100-row batch straight into the shard, the shard's CPU busy (%)"),
    ("routerpin_read_rows_cpu1", "proxy", None, "higher", "1,000-row read through the router, the shards' CPU busy (%)"),
    ("routerpin_read_rows_cpu1", "onenode", None, "higher", "1,000-row read on one node, its CPU busy (%)"),
    ("routerpin_read_rows_cpu0_us", "proxy", None, "lower", "1,000-row read through the router, CPU 0 (pgbench and the proxy) per read (us)"),
    ("routerpin_read_rows_cpu0_us", "onenode", None, "lower", "1,000-row read on one node, CPU 0 (pgbench) per read (us)"),
    ("routerpin_read_rows_cpu1_us", "proxy", None, "lower", "1,000-row read through the router, the shards' CPU per read (us)"),
    ("routerpin_read_rows_cpu1_us", "onenode", None, "lower", "1,000-row read on one node, its CPU per read (us)"),
]

# (comparison, numerator variant, denominator variant, goal, "higher"/"lower", what)
RATIOS = [
    # Issue 42: the acknowledging sinks against the JSONL file, side by side in
    # one run (bench/run.sh sinks).
    *[(comparison, sink, "jsonl", goal, direction, f"{what}, {label} / JSONL file")
      for sink, label in (("mqtt", "MQTT QoS 1 (mosquitto's defaults: 20 in flight, Nagle on)"),
                          ("mqtt_nodelay", "MQTT QoS 1 (mosquitto set_tcp_nodelay true)"),
                          ("mqtt_tuned", "MQTT QoS 1 (mosquitto set_tcp_nodelay true, 1,000 in flight)"),
                          ("rabbitmq", "RabbitMQ with publisher confirms"))
      for comparison, goal, direction, what in (
          ("sinks_drain", 0.7, "higher", "drain rate of a 1,000-row-batch backlog"),
          ("sinks_p50_ms", 1.5, "lower", "commit -> consumer p50 at 1,000 commits/s"))],
    ("lagquery_drain", "on", "off", 0.97, "higher",
     "bridge drain rate with its lag query after every round / every 5 s (200,000 rows, 100 originators, jsonl:/dev/null)"),
    # What refused rows cost the rest: an unrelated originator's p99 with refused
    # rows written beside it / without, per sink (bench/run.sh refusals).
    *[("refusals_p99_ms", f"{sink}_poison", f"{sink}_clean", None, "lower",
       f"unrelated originator's commit -> consumer p99, 5 refused rows a second beside it / none, {sink}")
      for sink in ("jetstream", "redis", "mqtt", "rabbitmq", "webhook")],
    # Per shard: the shards on CPU 1, the proxy and the clients on CPU 0.
    ("routerpin_insert", "proxy", "direct", 0.8, "higher",
     "single-row insert through pg_envelopes_router (PL/Proxy) / straight into the owning shard, per shard (shard and proxy on CPUs of their own), 4 binary-parameter clients"),
    ("routerpin_batch", "proxy", "direct", 0.95, "higher",
     "100-row batch of one originator through the router / straight into the owning shard, per shard, 4 binary-parameter clients"),
    # A read is bound by the proxy's CPU here (it turns 1,000 rows from text and
    # back), so the shard side's capacity is read from its CPU time per read.
    ("routerpin_read_rows_cpu1_us", "onenode", "proxy", 0.7, "higher",
     "1,000-row read over 64 originators, per shard: the shards' CPU time per read, one node / through the router and 4 shards (the reads/s a shard sustains, relative)"),
    ("routerpin_read_some_rows_cpu1_us", "onenode", "proxy", 0.7, "higher",
     "1,000-row read of 4 originators from a cursor, per shard: the shards' CPU time per read, one node / through the router"),
    ("routerpin_read_rows", "proxy", "onenode", None, "higher",
     "1,000-row read over 64 originators, rows to the client, through the router / one node, 4 clients (bound by the proxy's one CPU)"),
    ("routerpin_read_some_rows", "proxy", "onenode", None, "higher",
     "1,000-row read of 4 originators from a cursor, rows to the client, through the router / one node, 4 clients (bound by the proxy's one CPU)"),
    ("routerpin_insert_cpu1_us", "direct", "proxy", None, "higher",
     "single-row insert, the shard's CPU time per call: straight / through the router"),
    ("routerpin_read_rows_cpu0_us", "proxy", "onenode", None, "lower",
     "1,000-row read, CPU 0's time per read: pgbench and the proxy / pgbench alone (the router's own cost)"),
    ("routerpin_insert_cpu0_us", "proxy", "direct", None, "lower",
     "single-row insert, CPU 0's time per call: the clients and the proxy / the clients alone (the router's own cost)"),
    ("routerpin_batch_cpu0_us", "proxy", "direct", None, "lower",
     "100-row batch, CPU 0's time per call: the clients and the proxy / the clients alone"),
    # Per shard, noise-free: the shard's instructions per call (callgrind),
    # straight / through the router (above 1 would mean the routed call costs
    # the shard less).
    ("routerinstr_single_binary", "direct", "routed", 0.8, "higher",
     "single-row insert, the shard's instructions per call: straight / through the router, binary-parameter client (tokio-postgres, as gateways send)"),
    ("routerinstr_single_text", "direct", "routed", None, "higher",
     "single-row insert, the shard's instructions per call: straight / through the router, text-parameter client (pgbench -M prepared)"),
    ("routerinstr_batch_binary", "direct", "routed", 0.95, "higher",
     "100-row batch, the shard's instructions per call: straight / through the router, binary-parameter client"),
    ("routerinstr_mixed_binary", "direct", "routed", None, "higher",
     "100-row batch over 4 originators (packed per originator), the shard's instructions per call: straight / through the router, binary-parameter client"),
    ("routerinstr_select1", "prepared", "unprepared", None, "higher",
     "SELECT 1, instructions per call: prepared / unprepared (how PL/Proxy sends every call; the protocol's floor)"),
    # Everything on the same two cores: the proxy's work takes the shard's CPU.
    ("router_insert", "proxy", "direct", None, "higher",
     "single-row insert through pg_envelopes_router / straight into the owning shard, proxy and shards sharing both cores, 2 clients"),
    ("router_batch", "proxy", "direct", None, "higher",
     "100-row batch through the router / straight into the owning shard, sharing both cores, 2 clients"),
    ("router_read", "proxy", "onenode", None, "higher",
     "1,000-row read over 64 originators (count on the server) through the router and 4 shards / one node, sharing both cores, 1 client"),
    ("router_read_some", "proxy", "onenode", None, "higher",
     "1,000-row read of 4 originators from a cursor (count on the server) through the router / one node, sharing both cores, 1 client"),
    ("insert", "extension", "plain", 0.95, "higher",
     "single-row insert, extension / plain INSERT (meta + blob CTE) into the same pre-created partitions, 2 clients"),
    ("insert", "extension", "plain_idempotent", 1.0, "higher",
     "single-row insert, extension / the same plain INSERT with ON CONFLICT DO NOTHING (idempotent like the extension)"),
    ("insert", "plain_idempotent", "plain", None, "higher",
     "single-row insert, cost of idempotency alone: plain INSERT ... ON CONFLICT DO NOTHING / plain INSERT"),
    ("insert", "extension", "savepoint", 1.5, "higher",
     "single-row insert, extension / xmtpd's SAVEPOINT pattern into the same partitions, 2 clients"),
    ("insert", "extension", "flat", None, "higher",
     "single-row insert, extension / plain INSERT into unpartitioned tables, 2 clients"),
    ("insert", "extension", "partman", None, "higher",
     "single-row insert, extension / plain INSERT into pg_partman's premade partitions, 2 clients"),
    ("batch", "extension", "plain", 0.9, "higher",
     "100-row batch, extension / plain INSERT ... SELECT into the same partitions, 2 clients"),
    ("batch", "extension", "plain_idempotent", 1.0, "higher",
     "100-row batch, extension / the same plain INSERT ... SELECT with ON CONFLICT DO NOTHING"),
    ("insert8", "extension", "plain", 0.95, "higher",
     "single-row insert, extension / plain INSERT into the same pre-created partitions, 8 clients"),
    ("insert8", "extension", "plain_idempotent", 1.0, "higher",
     "single-row insert, extension / the idempotent plain INSERT, 8 clients"),
    ("batch8", "extension", "plain", 0.9, "higher",
     "100-row batch, extension / plain INSERT ... SELECT into the same partitions, 8 clients"),
    ("batch8", "extension", "plain_idempotent", 1.0, "higher",
     "100-row batch, extension / the idempotent plain INSERT ... SELECT, 8 clients"),
    ("inorder2", "extension", "plain", 0.95, "higher",
     "in-order single-row insert (each client its own originator), extension / plain INSERT, 2 clients"),
    ("inorder2", "extension", "plain_idempotent", 1.0, "higher",
     "in-order single-row insert, extension / idempotent plain INSERT, 2 clients"),
    ("inorder_batch2", "extension", "plain", 0.9, "higher",
     "in-order 100-row batch, extension / plain INSERT ... SELECT, 2 clients"),
    ("inorder_batch2", "extension", "plain_idempotent", 1.0, "higher",
     "in-order 100-row batch, extension / idempotent plain INSERT ... SELECT, 2 clients"),
    ("inorder8", "extension", "plain", 0.95, "higher",
     "in-order single-row insert (each client its own originator), extension / plain INSERT, 8 clients"),
    ("inorder8", "extension", "plain_idempotent", 1.0, "higher",
     "in-order single-row insert, extension / idempotent plain INSERT, 8 clients"),
    ("inorder_batch8", "extension", "plain", 0.9, "higher",
     "in-order 100-row batch, extension / plain INSERT ... SELECT, 8 clients"),
    ("inorder_batch8", "extension", "plain_idempotent", 1.0, "higher",
     "in-order 100-row batch, extension / idempotent plain INSERT ... SELECT, 8 clients"),
    ("late2", "extension", "plain_idempotent", 0.9, "higher",
     "single rows in random order (almost all late), extension / idempotent plain INSERT, 2 clients"),
    ("late8", "extension", "plain_idempotent", 0.9, "higher",
     "single rows in random order (almost all late), extension / idempotent plain INSERT, 8 clients"),
    ("backfill4", "extension", "plain_idempotent", 1.0, "higher",
     "parallel backfill of one originator, 100-row batches of interleaved ascending ranges, extension / idempotent plain INSERT ... SELECT, 4 clients"),
    ("backfill8", "extension", "plain_idempotent", 1.0, "higher",
     "parallel backfill of one originator, extension / idempotent plain INSERT ... SELECT, 8 clients"),
    ("bulk", "extension", "copy", 0.8, "higher",
     "10,000-row bulk, extension's batch function / COPY of meta and blob into the same partitions, 2 clients"),
    ("bulk", "extension", "insert_idempotent", None, "higher",
     "10,000-row bulk, extension / idempotent INSERT ... SELECT FROM unnest ON CONFLICT DO NOTHING, 2 clients"),
    ("instructions", "plain", "extension", None, "higher",
     "instructions per row, single-row: plain INSERT / extension (above 1: the extension runs fewer)"),
    ("instructions", "plain_idempotent", "extension", None, "higher",
     "instructions per row, single-row: idempotent plain INSERT / extension"),
    ("instructions", "batch_plain", "batch_extension", None, "higher",
     "instructions per row, 100-row batch: plain INSERT ... SELECT / extension"),
    ("instructions", "batch_plain_idempotent", "batch_extension", None, "higher",
     "instructions per row, 100-row batch: idempotent plain INSERT ... SELECT / extension"),
    ("instructions", "bulk_copy", "bulk_extension", None, "higher",
     "instructions per row, 10,000-row bulk: COPY / extension"),
    ("instructions", "bulk_plain_idempotent", "bulk_extension", None, "higher",
     "instructions per row, 10,000-row bulk: idempotent plain INSERT ... SELECT / extension"),
    ("instructions", "late_plain_idempotent", "late_extension", 0.9, "higher",
     "instructions per row, single rows each below a committed one (late): idempotent plain INSERT / extension"),
    ("instructions", "late_batch_plain_idempotent", "late_batch_extension", 1.0, "higher",
     "instructions per row, parallel backfill in 100-row batches (3 in 4 late): idempotent plain INSERT ... SELECT / extension"),
    ("batch", "plain_idempotent", "plain", None, "higher",
     "100-row batch, cost of idempotency alone: plain INSERT ... ON CONFLICT DO NOTHING / plain INSERT"),
    ("batch", "extension", "savepoint", None, "higher",
     "100-row batch, extension / xmtpd's SAVEPOINT pattern around the same INSERT, 2 clients"),
    ("batch", "extension", "flat", None, "higher",
     "100-row batch, extension / plain INSERT ... SELECT into unpartitioned tables, 2 clients"),
    ("notify", "on_8", "off_8", 0.85, "higher",
     "single-row inserts with the NOTIFY doorbell on / off, 8 writers"),
    ("notify", "on_2", "off_2", 0.85, "higher",
     "single-row inserts with the NOTIFY doorbell on / off, 2 writers"),
    ("crossing", "p99_worker", "p99_steady", 2.0, "lower",
     "p99 insert latency, 8 writers crossing a band every 10k rows / into existing bands, creation in a worker"),
    ("crossing", "p99_transaction", "p99_steady", 2.0, "lower",
     "p99 insert latency, 8 writers crossing a band every 10k rows / into existing bands, creation in the writer's transaction"),
    ("premake", "p99_premake", "p99_steady", 1.02, "lower",
     "p99 insert latency, 8 writers crossing a band every 10k rows, the bands created ahead by the maintenance worker (every 1 s, premake_fraction 0) / into existing bands"),
    ("premake", "p99_ondemand", "p99_steady", None, "lower",
     "p99 insert latency, 8 writers crossing a band every 10k rows, the bands created on demand (in a worker) / into existing bands (same cluster)"),
    ("premake", "max_premake", "max_ondemand", None, "lower",
     "longest insert, 8 writers crossing a band every 10k rows, the bands created ahead / on demand"),
    ("maintcost", "originators_10000", "originators_10", None, "lower",
     "one maintenance run with nothing to prune or create, time at 10,000 originators / at 10"),
    ("prune", "p99_worker", "p99_steady", 2.0, "lower",
     "p99 insert latency, 8 writers while prune_expired drops 104 bands of their originators / no pruning"),
    ("prune", "p99_transaction", "p99_steady", None, "lower",
     "p99 insert latency, 8 writers while prune_expired(in_transaction => true) drops the same bands / no pruning"),
    ("prune", "max_worker", "max_steady", None, "lower",
     "longest insert, 8 writers while prune_expired drops 104 bands of their originators / no pruning"),
    ("view", "sync_lookup", "sync_join", None, "higher",
     "100 rows of one originator after a mid-history cursor, gateway_envelopes_view (blob by key) / the join it was before 0.4.0"),
    ("view", "point_lookup", "point_join", None, "higher",
     "one envelope by key, gateway_envelopes_view (blob by key) / the join it was before 0.4.0"),
    ("view", "topic_lookup", "topic_join", None, "higher",
     "newest 50 envelopes of a topic across originators, gateway_envelopes_view (blob by key) / the join it was before 0.4.0"),
    ("view", "scan_lookup", "scan_join", None, "higher",
     "every envelope of the store (100,000), gateway_envelopes_view (blob by key) / the join it was before 0.4.0"),
] + [
    (f"shapes_{shape}_{parts}_c{clients}", "fn", "sql", 1.5, "higher",
     f"{what}, function / plain SQL over the roots, {parts} leaf partitions, {clients} client{'s' if clients > 1 else ''}")
    for shape, what in [
        ("originator", "one originator from the start (1,000 rows)"),
        ("poll", "poll at the end of one originator's data"),
        ("topics", "per-topic cursors, 4 topics x every originator from mid-history"),
        ("wave", "a wave page over the same entries with ceilings"),
        ("newest", "newest envelope of 4 topics"),
        ("maxima", "highest sequence id of every originator"),
    ]
    for parts in (50, 1000, 5000)
    for clients in (1, 4)
] + [
    (f"shapes_{shape}_{parts}_c{clients}", "fn", "sqllit", None, "higher",
     f"{what}, function / the same plain SQL with the values written in (pruned at PREPARE), {parts} leaf partitions, {clients} client{'s' if clients > 1 else ''}")
    for shape, what in [
        ("originator", "one originator from the start (1,000 rows)"),
        ("poll", "poll at the end of one originator's data"),
    ]
    for parts in (50, 1000, 5000)
    for clients in (1, 4)
] + [
    (f"xmtpd_{shape}_{width}_c{clients}", "fn", "xmtpd", 1.5, "higher",
     f"{what}, function / xmtpd's query (the better of generic and custom plan), {width:,}-id bands, {clients} client{'s' if clients > 1 else ''}")
    for shape, what in [
        ("originator", "one originator from the start (1,000 rows)"),
        ("originators", "every originator after a mid-history cursor (1,000 rows)"),
        ("topics", "4 topics x every cursor originator (1,000 rows)"),
        ("unfiltered", "everything after a mid-history cursor (1,000 rows)"),
        ("pertopic", "per-topic cursors, 80 entries, 100 an entry (1,000 rows)"),
        ("wave", "a wave page over the same entries with ceilings (1,000 rows)"),
        ("newest", "newest envelope of 4 topics by gateway time"),
        ("ceilings", "highest sequence id of 20 originators"),
    ]
    for width in (1000000, 10000)
    for clients in (1, 4)
] + [
    (f"xmtpd_{shape}_{width}_c{clients}", "layer", "xmtpd", None, "higher",
     f"the same through the xmtpd layer (envelopes_xmtpd) / xmtpd's query, {shape}, {width:,}-id bands, {clients} client{'s' if clients > 1 else ''}")
    for shape in ("originator", "originators", "topics", "unfiltered", "pertopic", "wave", "newest", "ceilings")
    for width in (1000000, 10000)
    for clients in (1, 4)
] + [
    (f"xmtpd_originator_{width}_c{clients}", "fn", "plain", 1.0, "higher",
     f"one originator from the start (1,000 rows), function / the hand-written join with the values written in, {width:,}-id bands, {clients} client{'s' if clients > 1 else ''}")
    for width in (1000000, 10000)
    for clients in (1, 4)
] + [
    ("read", "selector_50", "selector_5000", 1.3, "lower",
     "1,000-row cursor read, time at 5,000 leaf partitions / time at 50"),
    ("read", "selector_50", "selector_1000", 1.3, "lower",
     "1,000-row cursor read, time at 1,000 leaf partitions (--quick) / time at 50"),
    ("read", "selector_5000", "lateral_5000", 1.0, "higher",
     "1,000-row cursor read at 5,000 partitions, selector / hand-written LATERAL query (throughput)"),
    ("read", "selector_50", "lateral_50", 1.0, "higher",
     "1,000-row cursor read at 50 partitions, selector / hand-written LATERAL query (throughput)"),
    ("feedcost", "insert_current", "insert_baseline", 0.97, "higher",
     "in-order single-row insert, this version / the baseline build (the change feed's cost), 2 clients"),
    ("feedcost", "batch_current", "batch_baseline", 0.97, "higher",
     "in-order 100-row batch, this version / the baseline build (the change feed's cost), 2 clients"),
    ("latebridge", "late", "inorder", 0.9, "higher",
     "bridge drain rate to JetStream, 10% late arrivals / in order"),
    ("latebridge", "late50", "inorder", 0.9, "higher",
     "bridge drain rate to JetStream, 50% late arrivals / in order"),
    ("idle", "poll_current_10000", "poll_current_10", 1.5, "lower",
     "idle consumer poll, time at 10,000 originators / at 10"),
    ("idle", "poll_current_1000", "poll_current_10", 1.5, "lower",
     "idle consumer poll, time at 1,000 originators / at 10"),
    ("idle", "poll_baseline_1000", "poll_current_1000", None, "higher",
     "idle consumer poll at 1,000 originators, baseline time / this version's"),
    ("decoding", "insert_logical", "insert_replica", None, "higher",
     "in-order single-row insert, wal_level = logical (with a slot) / replica"),
    ("decoding", "drain_feed", "drain_decoding", None, "higher",
     "draining 100-row transactions, table feed (consumer batches of 1,000) / logical decoding (test_decoding)"),
    ("decoding", "idle_after_100MB_decoding", "idle_after_100MB_feed", None, "higher",
     "an idle read after 100 MB of WAL from another database, logical decoding time / table feed time"),
    ("decoding", "register_decoding", "register_feed", None, "higher",
     "registering while a transaction runs 5 s elsewhere, slot creation time / consumer_register time"),
    ("horizon", "p99_envelope_blocked", "p99_envelope_clear", 2.0, "lower",
     "envelope commit -> JetStream p99, unrelated transaction held open / undisturbed"),
    ("horizon", "p99_outbox_blocked", "p99_outbox_clear", 2.0, "lower",
     "outbox commit -> JetStream p99, unrelated transaction held open / undisturbed"),
]


SECTION_START = "<!-- section: {} -->"
SECTION_END = "<!-- end of section: {} -->"


def main(out_dir: str, results_md: str, section: str = "") -> None:
    out = Path(out_dir)
    meta = [line.split("\t", 1) for line in (out / "meta.tsv").read_text().splitlines() if line]
    values = defaultdict(list)  # (comparison, durability, variant) -> [value]
    units = {}
    for line in (out / "results.tsv").read_text().splitlines():
        comparison, variant, durability, _run, value, unit = line.split("\t")
        values[(comparison, durability, variant)].append(float(value))
        units[(comparison, variant)] = unit

    if section:
        lines = [SECTION_START.format(section), f"## Run of `{section}` only", ""]
    else:
        lines = ["# Benchmark results", "",
                 "Generated by `bench/run.sh` (via `bench/report.py`); do not edit by hand.", ""]
    for key, value in meta:
        lines.append(f"- {key}: `{value}`" if key in ("command", "setting") else f"- {key}: {value}")
    level = "###" if section else "##"
    lines += ["", f"{level} Ratios", "",
              "| comparison | synchronous_commit | ratio of medians | goal | met |",
              "|---|---|---|---|---|"]
    ratio_rows = []
    for comparison, num, den, goal, direction, what in RATIOS:
        for durability in ("off", "on"):
            a, b = values.get((comparison, durability, num)), values.get((comparison, durability, den))
            if not a or not b:
                continue
            ratio = statistics.median(a) / statistics.median(b)
            if goal is None:
                lines.append(f"| {what} | {durability} | {ratio:.3f} | - | - |")
            else:
                met = ratio >= goal if direction == "higher" else ratio <= goal
                sign = ">=" if direction == "higher" else "<="
                lines.append(f"| {what} | {durability} | {ratio:.3f} | {sign} {goal} | {'yes' if met else 'NO'} |")
            ratio_rows.append((f"{comparison} {num}/{den} ({durability})", ratio, goal))
    lines += ["", f"{level} Absolute numbers", "",
              "| measurement | synchronous_commit | median | goal | met |", "|---|---|---|---|---|"]
    for comparison, variant, goal, direction, what in ABSOLUTE:
        for durability in ("off", "on"):
            vs = values.get((comparison, durability, variant))
            if not vs:
                continue
            m = statistics.median(vs)
            if goal is None:
                lines.append(f"| {what} | {durability} | {m:.1f} | - | - |")
                continue
            met = m >= goal if direction == "higher" else m <= goal
            sign = ">=" if direction == "higher" else "<="
            lines.append(f"| {what} | {durability} | {m:.1f} | {sign} {goal} | {'yes' if met else 'NO'} |")
    lines += ["", f"{level} Every variant", "",
              "| comparison | synchronous_commit | variant | median | min | max | runs | unit |",
              "|---|---|---|---|---|---|---|---|"]
    for (comparison, durability, variant), vs in sorted(values.items()):
        lines.append(f"| {comparison} | {durability} | {variant} | {statistics.median(vs):.1f} | "
                     f"{min(vs):.1f} | {max(vs):.1f} | {len(vs)} | {units[(comparison, variant)]} |")
    notes = Path(results_md).with_name("NOTES.md")
    notes_text = notes.read_text().rstrip() if notes.exists() else ""
    if section:
        lines.append(SECTION_END.format(section))
        text = Path(results_md).read_text() if Path(results_md).exists() else ""
        # The main part (and other sections) as they were, without the notes (any
        # earlier version of them: a block from "## Notes" to the next section).
        text = re.sub(r"(?ms)^## Notes\n.*?(?=^<!-- section: |\Z)", "", text)
        start, end = SECTION_START.format(section), SECTION_END.format(section)
        if start in text and end in text:
            text = text[:text.index(start)] + text[text.index(end) + len(end):]
        text = text.rstrip() + "\n\n" + "\n".join(lines) + "\n"
        if notes_text:
            text += "\n" + notes_text + "\n"
        Path(results_md).write_text(text)
        return
    if notes_text:
        lines += ["", notes_text]
    Path(results_md).write_text("\n".join(lines) + "\n")
    plot(ratio_rows, Path(results_md).with_name("results.png"))


def plot(rows, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(rows)))
    names = [r[0] for r in rows]
    ax.barh(names, [r[1] for r in rows], color="#4c72b0")
    for i, (_, _, goal) in enumerate(rows):
        if goal is not None:
            ax.plot([goal, goal], [i - 0.4, i + 0.4], color="#c44e52", linewidth=2)
    for i, (_, ratio, _) in enumerate(rows):
        ax.annotate(f"{ratio:.2f}", (ratio, i), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    # Log scale: the selector vs LATERAL ratio is in the thousands, the rest near 1.
    ax.set_xscale("log")
    ax.axvline(1.0, color="#888888", linewidth=0.8)
    ax.set_xlabel("ratio of medians, log scale (red: goal, grey: 1.0)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    args = sys.argv[1:]
    section = ""
    if "--section" in args:
        i = args.index("--section")
        section = args[i + 1]
        del args[i:i + 2]
    main(args[0], args[1], section)
