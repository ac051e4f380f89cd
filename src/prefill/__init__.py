"""prefill: see, measure and predict the first phase of LLM inference."""
