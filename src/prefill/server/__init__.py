"""The server: OpenAI-compatible HTTP app, scheduler, metrics, and the load-test client.

app.py (routes) -> scheduler.py (a queue and the worker thread) -> prefill.engine.loop.StepLoop (admission against the
shared KV pool, batched decode, chunked prefill, the prefix cache) -> prefill.engine.request.Request (one request's
state and the one place a token is accepted); metrics.py (Prometheus); openai_schema.py (wire format);
loadtest.py + loadtest_report.py (client). Importing this package imports no torch.
"""
