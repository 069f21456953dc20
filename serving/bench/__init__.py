"""End-to-end benchmarks over HTTP: our service beside stock vLLM (`triage bench serve`)."""
