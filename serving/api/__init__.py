"""HTTP routers, one per resource: openai (v1), admin (operators), audit (auditors), health."""
