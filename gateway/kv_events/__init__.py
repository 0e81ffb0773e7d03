"""vLLM KV-cache events: the wire format, and (later) the subscriber and the exact block index."""
