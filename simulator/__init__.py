"""A vLLM replica without a GPU: an engine model timed by the roofline, behind vLLM's HTTP surface."""
