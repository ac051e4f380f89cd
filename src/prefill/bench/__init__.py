"""The benchmark: our engine against its peers on the same tokens, the cost model beside every point.

runner (the sweep) -> timing (clocks, memory), peers (transformers, llama.cpp), calibrate (fit and predict);
report (tables, JSON) and plot (PNG) show a run; gpu runs the Llama-3-8B-shaped check behind benchmarks/gpu.sh.
"""
