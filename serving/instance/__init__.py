"""A stock vLLM API server with our scheduler class inside (`triage instance`).

    fields.py      what a request carries to the engine: level in vLLM's `priority`,
                   deadlines and predicted length in flat `vllm_xargs` keys, and how
                   the scheduler reads them back (`request_fields`)
    load.py        the load snapshot the scheduler answers (queued and running requests
                   with level, slack, predicted remaining tokens; estimator; KV blocks)
    middleware.py  `GET /triage/load` on vLLM's own API server (its `--middleware` option)
    launch.py      the `vllm serve` command line `triage instance` runs

This package is imported inside vLLM's processes: no web framework of ours, no database.
"""
