"""The OpenAI-compatible server: one chat request from HTTP to its first token.

app.py           create_app: wires the routers below and one ServerState, and the lifespan that starts the worker
config.py        ServeConfig (sizes and limits, frozen), the model id, the default KV-pool size
state.py         ServerState (request.app.state.server): engine, config, metrics, worker, intake, supervisor,
                 the requests in flight (Pending), and how they are settled, aborted and shut down
completions.py   POST /v1/completions and /v1/chat/completions: check, prepare, one job per prompt, answer
intake.py        Intake: a validated body -> sampling, each prompt's ids and max_tokens, grammar (or a 400)
worker.py        Worker: the bounded queue and the one thread that runs prefill.engine.loop.StepLoop; call(fn)
replies.py       outcome_of (the one event switch), the full JSON reply and the server-sent events
info.py          GET /health, /metrics, /v1/models, /v1/models/{model}
tokenizer_routes.py  vLLM's POST /tokenize, POST /detokenize, GET /tokenizer_info
openai_schema.py the wire format: request models, response and chunk bodies, error bodies
openapi.py       the OpenAPI document as the server behaves (400 not 422, its limits, event streams)
error_handlers.py, middleware.py  every refusal as OpenAI's error body; the body limit (413)
logprobs.py, structured.py        log-probabilities on the wire; grammars for response_format and tool calls
metrics.py, supervisor.py         Prometheus metrics; the watch on the worker (/health 503, exit 1)
server.py        uvicorn in the foreground (prefill serve) or on a background thread (tests, benchmarks)

A chat request: completions.chat_completions -> completions.generate (Intake.check, Intake.prepare on a thread,
pending_of, ServerState.submit -> Worker.submit) -> on the worker thread Worker._turn -> StepLoop.add, StepLoop.step
(Scheduler.schedule, ModelRunner.run, sample_rows) -> Request.accept -> emit -> ServerState.deliver on the event loop
-> replies.stream_reply (or full_reply) -> outcome_of -> the first token's chunk.
"""
