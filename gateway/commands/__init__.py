"""One module per `kvgate` sub-command, each with `add_arguments(parser)` and `run(args) -> int`.

Modules here import only the standard library at import time, so building the CLI parser is cheap.
"""
