"""device: what this CPU or GPU says it can do, and the cache folder keyed by it. Nothing here is timed."""
