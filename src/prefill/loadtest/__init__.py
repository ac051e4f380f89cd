"""A load-test client for any OpenAI-compatible server: it knows nothing of the planner.

client (the requests, their clocks and the Poisson or burst arrivals) -> report (TTFT, ITL, TPOT, E2E and goodput
percentiles, tables and plots); server_calibration times a running server just before and after a load.
"""
