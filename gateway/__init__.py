"""kvgate's I/O shell: the ASGI app, forwarder, fleet scraper, stores, config, metrics and CLI."""
