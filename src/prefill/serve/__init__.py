"""The server: OpenAI-compatible HTTP app, scheduler, prefix cache, metrics, and the load-test client.

app.py (routes) -> scheduler.py (one forward at a time, chunked prefill) -> prefix_cache.py (K/V of shared
prefixes); metrics.py (Prometheus); openai_schema.py (wire format); loadtest.py + loadtest_report.py (client).
Importing this package imports no torch: the engine-backed modules are imported where used.
"""
