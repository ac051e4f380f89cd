"""The serving simulator and the GPU capacity planner: they read the load test's traces and records, never the
other way.

simulate (the real scheduling policy over a trace, driven by sim_runner's simulated clock) -> gpu_serving (a
catalog GPU deployment run by vLLM, SGLang or TensorRT-LLM) -> capacity (replicas and TP width under an SLO) ->
planner (GPU x TP x replicas x engine, ranked by cost); engine_fit and cpu_fit fit the step model to a user's
own load test; gpu_validation checks it against published results; load_prediction is `loadtest --predict`.
"""
