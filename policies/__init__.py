"""Pure decision logic: no sockets, no web framework, no Redis. Inputs are frozen values and `now`."""
