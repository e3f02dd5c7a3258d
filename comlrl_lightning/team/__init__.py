"""The team: agent specs, model loading (hub ids, local folders, ``builtin:`` models) and per-agent threads."""
